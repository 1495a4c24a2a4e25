"""History shaped like a busy shop's, written into the real ``mysqlq_attempt`` table.

Server-side ``INSERT … SELECT`` from MariaDB's sequence engine, in chunks: four queues,
eight tasks, every outcome (succeeded most), error classes on failures, waits and run
times that differ per task, payloads on final rows, spread evenly over a time span.
"""

from __future__ import annotations

import time
from typing import Any

CHUNK = 100_000

SEED_SQL = """
INSERT INTO mysqlq_attempt
  (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
   finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
   traceback, result, payload, actor)
SELECT %(base)s + seq, ELT(1 + seq %% 4, 'default', 'emails', 'reports', 'payments'),
       ELT(1 + (seq DIV 4) %% 8, 'shop.tasks.send_receipt', 'shop.tasks.charge',
           'shop.tasks.render_pdf', 'shop.tasks.sync_stock', 'shop.tasks.notify',
           'shop.tasks.resize_image', 'shop.tasks.export_csv', 'shop.tasks.reindex'),
       1 + (o = 'retried'), o, seq %% 3,
       fin - INTERVAL (w + r) MICROSECOND, fin - INTERVAL r MICROSECOND, fin,
       'bench-worker', 'bench-host', 4242, 7, 'mysqlq-task-0',
       IF(o IN ('retried', 'failed', 'lost'),
          ELT(1 + CRC32(seq * 3) %% 5, 'TimeoutError', 'ConnectionError', 'ValueError',
              'KeyError', 'WorkerLost'), ''),
       IF(o IN ('retried', 'failed'), CONCAT('failure of row ', seq), ''), '', NULL,
       IF(o IN ('succeeded', 'failed', 'cancelled'),
          CONCAT('{"args":[', seq, '],"kwargs":{"note":"bench"}}'), ''),
       IF(o = 'cancelled', 'cli:bench', '')
  FROM (SELECT seq,
               ELT(1 + CRC32(seq) %% 40, 'retried', 'retried', 'failed', 'lost', 'cancelled',
                   'succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded',
                   'succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded',
                   'succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded',
                   'succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded',
                   'succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded',
                   'succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded',
                   'succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded') AS o,
               UTC_TIMESTAMP(6) - INTERVAL %(end_us)s MICROSECOND
                 - INTERVAL ROUND(%(span_us)s * (%(total)s - seq) / %(total)s) MICROSECOND
                 AS fin,
               CRC32(seq * 7) %% (1000 + 200000 * ((seq DIV 4) %% 8)) AS w,
               CRC32(seq * 13) %% (2000 + 100000 * ((seq DIV 32) %% 8)) AS r
          FROM SEQUENCE_TABLE) AS s
"""


def seed(conn: Any, rows: int, span_seconds: float, end_seconds_ago: float,
         base: int = 10_000_000) -> float:
    """Insert ``rows`` history rows finished over ``span_seconds`` ending that long ago."""
    started = time.perf_counter()
    cursor = conn.cursor()
    for first in range(1, rows + 1, CHUNK):
        last = min(first + CHUNK - 1, rows)
        table = f"seq_{first}_to_{last}"
        cursor.execute(SEED_SQL.replace("SEQUENCE_TABLE", table), {
            "base": base, "total": rows, "span_us": int(span_seconds * 1e6),
            "end_us": int(end_seconds_ago * 1e6)})
    return time.perf_counter() - started

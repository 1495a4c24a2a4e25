"""The errors a benchmark run stops on, with what went wrong and what to do."""


class BenchError(RuntimeError):
    """A run can't go on (server gone or restarted, a worker hung or failed)."""


class ServerRestarted(BenchError):
    """MariaDB went away or restarted while a workload ran: its figures are void."""

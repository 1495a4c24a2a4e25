"""Queue names, task names and dedup keys compare exactly (binary, no padding).

The table default (utf8mb4_general_ci) makes 'Key' = 'key' = 'key ' and every emoji
equal: a worker of 'Reports' would take 'reports' messages, and distinct dedup keys would
drop each other's messages. The right collation depends on the server, which a field's
``db_collation`` can't express, so this migration picks it.
"""

from django.db import migrations

COLUMNS = {
    "mysqlq_message": [("queue", "VARCHAR(64) NOT NULL"),
                       ("task_name", "VARCHAR(255) NOT NULL"),
                       ("dedup_key", "VARCHAR(255) NULL")],
    "mysqlq_attempt": [("queue", "VARCHAR(64) NOT NULL"),
                       ("task_name", "VARCHAR(255) NOT NULL")],
}


def exact_collation(connection) -> str:
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"
    if connection.mysql_version >= (8, 0, 17):
        return "utf8mb4_0900_bin"
    return "utf8mb4_bin"  # older MySQL: binary, but trailing spaces still pad


def alter(apps, schema_editor, collation=None) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collate = f"COLLATE {collation or exact_collation(connection)}"
    for table, columns in COLUMNS.items():
        changes = ", ".join(
            f"MODIFY {name} {kind.replace(' NOT NULL', '').replace(' NULL', '')} "
            f"CHARACTER SET utf8mb4 {collate} {'NOT NULL' if 'NOT NULL' in kind else 'NULL'}"
            for name, kind in columns
        )
        schema_editor.execute(f"ALTER TABLE {table} {changes}")


def back_to_default(apps, schema_editor) -> None:
    alter(apps, schema_editor, collation="utf8mb4_general_ci")


class Migration(migrations.Migration):
    atomic = False  # DDL on MySQL commits anyway
    dependencies = [("django_mysqlq", "0002_worker_listening")]
    operations = [migrations.RunPython(alter, back_to_default, atomic=False)]

"""Dataset columns as task arguments: which Spark types can be JSON, and row encoding.

The schema is checked on the driver before anything runs (a column that can never be
a JSON argument fails the job at once); each row is encoded on its executor, where a
value that can't be encoded (NaN, a payload too large) makes that row a bad row,
counted and shown, never a half-written message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
)

from .errors import PipelineError

SCALARS = (BooleanType, ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType,
           StringType, NullType)
KEY_PREFIX = "spark:"

Convert = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class Mapping:
    """Which columns feed the task: positional ``args`` and ``kwargs`` name -> column."""

    args: tuple[str, ...]
    kwargs: tuple[tuple[str, str], ...]
    dedup_column: str | None = None

    @property
    def columns(self) -> list[str]:
        wanted = [*self.args, *(column for _, column in self.kwargs)]
        if self.dedup_column is not None:
            wanted.append(self.dedup_column)
        return list(dict.fromkeys(wanted))


def type_problem(data_type: DataType, where: str) -> str | None:
    """Why a column of this type can never be a JSON argument, or None if it can."""
    if isinstance(data_type, SCALARS):
        return None
    if isinstance(data_type, ArrayType):
        return type_problem(data_type.elementType, f"{where}[]")
    if isinstance(data_type, StructType):
        for field in data_type.fields:
            problem = type_problem(field.dataType, f"{where}.{field.name}")
            if problem:
                return problem
        return None
    if isinstance(data_type, MapType):
        if not isinstance(data_type.keyType, StringType):
            return (f"{where} is a map with {data_type.keyType.simpleString()} keys; JSON "
                    "objects have string keys: cast the keys to string")
        return type_problem(data_type.valueType, f"{where}{{}}")
    hint = ("encode it (base64) or leave it out" if isinstance(data_type, BinaryType) else
            "cast it to string (ISO text) or to a number in the input")
    return f"{where} is {data_type.simpleString()}, which is not a JSON value: {hint}"


def check_schema(schema: StructType, mapping: Mapping) -> None:
    """Raise naming every column that is missing or can't be an argument."""
    if not mapping.args and not mapping.kwargs:
        raise PipelineError("Give the task's arguments: --args COL,COL… and/or "
                            "--kwargs NAME=COL,….")
    names = {field.name: field for field in schema.fields}
    missing = [column for column in mapping.columns if column not in names]
    if missing:
        raise PipelineError(f"Column(s) {', '.join(missing)} not in the input; it has "
                            f"{', '.join(names) or 'no columns'}.")
    bad_names = [name for name, _ in mapping.kwargs if not name.isidentifier()]
    if bad_names:
        raise PipelineError(f"--kwargs name(s) {', '.join(map(repr, bad_names))} are not "
                            "Python identifiers: write NAME=COLUMN, e.g. user_id=id.")
    problems = [problem for column in mapping.columns
                if (problem := type_problem(names[column].dataType, column))]
    if problems:
        raise PipelineError("The input can't be task arguments: " + "; ".join(problems)
                            + ". Nothing was enqueued.")


def converter(data_type: DataType) -> Convert | None:
    """How a value from Arrow's ``to_pylist`` becomes its JSON value (None: as it is)."""
    if isinstance(data_type, MapType):
        inner = converter(data_type.valueType)
        return lambda value: None if value is None else {
            key: inner(item) if inner else item for key, item in value}
    if isinstance(data_type, ArrayType):
        inner = converter(data_type.elementType)
        if inner is None:
            return None
        return lambda value: None if value is None else [inner(item) for item in value]
    if isinstance(data_type, StructType):
        inner_fields = [(field.name, converter(field.dataType)) for field in data_type.fields]
        if all(inner is None for _, inner in inner_fields):
            return None
        return lambda value: None if value is None else {
            name: inner(value[name]) if inner else value[name] for name, inner in inner_fields}
    return None


def dedup_key(task_name: str, queue: str, identity: str) -> str:
    """The message's dedup key: the same row of the same job is the same message."""
    digest = hashlib.sha256(f"{task_name}\0{queue}\0{identity}".encode()).hexdigest()
    return f"{KEY_PREFIX}{digest}"


def identity_text(value: Any) -> str:
    """A dedup column's value as text (JSON, so 1 and "1" stay apart)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)

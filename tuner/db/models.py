"""SQLAlchemy 2 models of the records database.

- ``meta``: key/value; holds ``schema_version`` (checked on open).
- ``target``: one row per machine kind (target key, CPU, ISA features, cores, caches).
- ``workload``: one row per canonical workload key (kind, parameters, FLOPs).
- ``run``: one row per tuning session (command, strategy, thread budget, versions, NumPy
  baseline measured in the same run, summary).
- ``trial``: one row per measured candidate: template and version, config JSON and hash,
  status and error text, compile time, every timing sample and their statistics, strategy,
  run id, versions, timestamp.
"""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

SCHEMA_VERSION = 1


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Meta(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class TargetRow(Base):
    __tablename__ = "target"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(128), unique=True)
    cpu_name: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(256), default="")
    cores: Mapped[int] = mapped_column(Integer)
    features: Mapped[list] = mapped_column(JSON)
    caches: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WorkloadRow(Base):
    __tablename__ = "workload"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(1024), unique=True)
    params: Mapped[dict] = mapped_column(JSON)
    flops: Mapped[int] = mapped_column(Integer)


class RunRow(Base):
    __tablename__ = "run"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    command: Mapped[str] = mapped_column(Text, default="")
    strategy: Mapped[str] = mapped_column(String(64), default="")
    threads: Mapped[int] = mapped_column(Integer, default=1)
    target_id: Mapped[int] = mapped_column(ForeignKey("target.id"))
    versions: Mapped[dict] = mapped_column(JSON, default=dict)
    baseline: Mapped[dict] = mapped_column(JSON, default=dict)
    summary: Mapped[dict] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)


class TrialRow(Base):
    __tablename__ = "trial"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("run.id"), nullable=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workload.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("target.id"))
    template: Mapped[str] = mapped_column(String(64))
    template_version: Mapped[int] = mapped_column(Integer)
    config: Mapped[str] = mapped_column(Text)          # canonical JSON
    config_hash: Mapped[str] = mapped_column(String(16))
    threads: Mapped[int] = mapped_column(Integer)      # thread budget of the tuning run
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str] = mapped_column(Text, default="")
    compile_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples: Mapped[list] = mapped_column(JSON, default=list)  # seconds per call
    median: Mapped[float | None] = mapped_column(Float, nullable=True)
    iqr: Mapped[float | None] = mapped_column(Float, nullable=True)
    p95: Mapped[float | None] = mapped_column(Float, nullable=True)
    mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    gflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    strategy: Mapped[str] = mapped_column(String(64), default="")
    versions: Mapped[dict] = mapped_column(JSON, default=dict)
    info: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    workload: Mapped[WorkloadRow] = relationship()
    target: Mapped[TargetRow] = relationship()

    __table_args__ = (
        Index("ix_trial_lookup", "workload_id", "target_id", "template", "threads", "status"),
        Index("ix_trial_config", "workload_id", "target_id", "config_hash"),
    )


class ClaimRow(Base):
    """A candidate being measured right now by some tuner process (possibly on another host).

    Claimed before measuring, deleted in the same transaction that records the trial. A claim
    expires unless its owner renews it (heartbeat), so a killed tuner's candidates return to
    the pool; a claim by a dead process on the same host is released at once.
    """

    __tablename__ = "claim"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workload.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("target.id"))
    template: Mapped[str] = mapped_column(String(64))
    template_version: Mapped[int] = mapped_column(Integer)
    threads: Mapped[int] = mapped_column(Integer)
    config_hash: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[str] = mapped_column(String(36))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    expires_at: Mapped[datetime] = mapped_column()

    __table_args__ = (
        UniqueConstraint("workload_id", "target_id", "template", "template_version", "threads",
                         "config_hash", name="uq_claim_candidate"),
    )


__all__ = ["ClaimRow", "Base", "Meta", "TargetRow", "WorkloadRow", "RunRow", "TrialRow", "SCHEMA_VERSION",
           "utcnow"]

"""Every setting of the pipeline, declared once, in modules per concern:

- `names`: topic names and the value sets of a few settings (no validation library: cheap)
- `base`: how a setting is declared (its flag and environment name) and the shared types
- `kafka`, `storage`: the broker and the shard store
- `policy`: the sample policy, export's cut and the retry delays
- `workers`: the generate and tokenize workers, and what every worker observes
- `commands`: the one-shot and supervising commands

The command line derives its flags from these classes (streams/cli/flags.py) and `draftgen
run` hands whole settings objects to the workers it starts. Secrets are `SecretStr`: they come
from the environment only, print as `**********` and are left out when settings are written
for a child process.

`from streams.core.settings import X` imports the module that holds X when X is first asked
for, so a command that needs only `names` does not import pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from streams.core.settings.names import (
    COMPLETIONS,
    DEAD_LETTERS,
    DEFAULT_CONCURRENCY,
    GENERATE_GROUP,
    GENERATED,
    PROMPTS,
    WORKER_STATS,
    Compression,
    GenerateApi,
    KeepOrDrop,
    LogLevel,
    OverLength,
    RegenMode,
    SaslMechanism,
    SecurityProtocol,
    generate_prefetch,
    generate_window,
)

if TYPE_CHECKING:
    from streams.core.settings.base import (
        Bootstrap,
        Concurrency,
        DatasetName,
        OutputRoot,
        SafeName,
        SafePrefix,
        ServerUrl,
        Settings,
        TokenizerDir,
        secrets_removed,
        setting,
    )
    from streams.core.settings.commands import (
        AuditSettings,
        DeadLetterSelection,
        ExportSettings,
        LogSettings,
        PublishSettings,
        ReplaySettings,
        ReportSettings,
        RunSettings,
        SealSettings,
        StatusSettings,
    )
    from streams.core.settings.kafka import (
        KafkaSettings,
        StackSettings,
        current_stack,
        kafka_if_configured,
        record_size_bound,
    )
    from streams.core.settings.policy import (
        BackoffKind,
        ExportCut,
        LengthPolicy,
        RetrySettings,
        SamplePolicy,
    )
    from streams.core.settings.storage import StorageSettings
    from streams.core.settings.workers import (
        GenerateSettings,
        ObserveSettings,
        OnceSettings,
        SamplingSettings,
        TokenizeSettings,
    )

# which module holds each name that needs pydantic
_HOME = {
    "base": (
        "Bootstrap",
        "Concurrency",
        "DatasetName",
        "OutputRoot",
        "SafeName",
        "SafePrefix",
        "ServerUrl",
        "Settings",
        "TokenizerDir",
        "secrets_removed",
        "setting",
    ),
    "commands": (
        "AuditSettings",
        "DeadLetterSelection",
        "ExportSettings",
        "LogSettings",
        "PublishSettings",
        "ReplaySettings",
        "ReportSettings",
        "RunSettings",
        "SealSettings",
        "StatusSettings",
    ),
    "kafka": (
        "KafkaSettings",
        "StackSettings",
        "current_stack",
        "kafka_if_configured",
        "record_size_bound",
    ),
    "policy": ("BackoffKind", "ExportCut", "LengthPolicy", "RetrySettings", "SamplePolicy"),
    "storage": ("StorageSettings",),
    "workers": (
        "GenerateSettings",
        "ObserveSettings",
        "OnceSettings",
        "SamplingSettings",
        "TokenizeSettings",
    ),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}

__all__ = [
    "COMPLETIONS",
    "DEAD_LETTERS",
    "DEFAULT_CONCURRENCY",
    "GENERATED",
    "GENERATE_GROUP",
    "PROMPTS",
    "WORKER_STATS",
    "AuditSettings",
    "BackoffKind",
    "Bootstrap",
    "Compression",
    "Concurrency",
    "DatasetName",
    "DeadLetterSelection",
    "ExportCut",
    "ExportSettings",
    "GenerateApi",
    "GenerateSettings",
    "KafkaSettings",
    "KeepOrDrop",
    "LengthPolicy",
    "LogLevel",
    "LogSettings",
    "ObserveSettings",
    "OnceSettings",
    "OutputRoot",
    "OverLength",
    "PublishSettings",
    "RegenMode",
    "ReplaySettings",
    "ReportSettings",
    "RetrySettings",
    "RunSettings",
    "SafeName",
    "SafePrefix",
    "SamplePolicy",
    "SamplingSettings",
    "SaslMechanism",
    "SealSettings",
    "SecurityProtocol",
    "ServerUrl",
    "Settings",
    "StackSettings",
    "StatusSettings",
    "StorageSettings",
    "TokenizeSettings",
    "TokenizerDir",
    "current_stack",
    "generate_prefetch",
    "generate_window",
    "kafka_if_configured",
    "record_size_bound",
    "secrets_removed",
    "setting",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once
    return value

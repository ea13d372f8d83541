"""The configuration schema: what a config file may say, with defaults and cross-field checks.

Loaded from YAML by `llm_gateway.settings.loader` (which adds file/line context to errors and expands
`${VAR}` references); every field can be overridden from the environment as
`GATEWAY_<SECTION>__<FIELD>` (for example `GATEWAY_SERVER__PORT=9000`). Secrets are `SecretStr`:
they print as `**********` and only `.get_secret_value()` reveals them.

One module per part, each importing only those above it in this list: `vocabulary` (the names a config
may use, the strict base of every section), `access` (keys, limits, budgets, prices, admin keys, the
limit store), `server` (the HTTP server, the usage ledger, the database), `managed` (the engines the gateway
starts itself, and the hosts' memory budgets), `gateway` (backends, models, routing and `GatewayConfig`, the
whole). The rest of the product imports from here.
"""

from llm_gateway.settings.access import (
    AdminConfig,
    AdminKeyConfig,
    AuthConfig,
    Budget,
    KeyConfig,
    Limits,
    LimitsConfig,
    Price,
)
from llm_gateway.settings.gateway import (
    AdapterConfig,
    AffinityConfig,
    BackendConfig,
    DeploymentConfig,
    GatewayConfig,
    ModelConfig,
    ProbeConfig,
    RoutingConfig,
    Timeouts,
)
from llm_gateway.settings.managed import ManagedConfig, ManagedHosts
from llm_gateway.settings.server import (
    DATABASE_SCHEMES,
    BatchesConfig,
    CorsConfig,
    DatabaseConfig,
    ServerConfig,
    TracingConfig,
    UsageConfig,
)
from llm_gateway.settings.vocabulary import (
    CLASS_NAMES,
    PRIORITY_RANKS,
    Capability,
    EngineKind,
    Name,
    PriorityClass,
    Strategy,
    WeightFormat,
)

__all__ = [
    "CLASS_NAMES",
    "DATABASE_SCHEMES",
    "PRIORITY_RANKS",
    "AdapterConfig",
    "AdminConfig",
    "AdminKeyConfig",
    "AffinityConfig",
    "AuthConfig",
    "BackendConfig",
    "BatchesConfig",
    "Budget",
    "Capability",
    "CorsConfig",
    "DatabaseConfig",
    "DeploymentConfig",
    "EngineKind",
    "GatewayConfig",
    "KeyConfig",
    "Limits",
    "LimitsConfig",
    "ManagedConfig",
    "ManagedHosts",
    "ModelConfig",
    "Name",
    "Price",
    "PriorityClass",
    "ProbeConfig",
    "RoutingConfig",
    "ServerConfig",
    "Strategy",
    "Timeouts",
    "TracingConfig",
    "UsageConfig",
    "WeightFormat",
]

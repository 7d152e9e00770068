"""Speech engines: one module per engine behind ``gateway.engines.base.Engine``."""

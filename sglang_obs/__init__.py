"""sglang-obs: observability for SGLang servers.

One import namespace; the folders of the checkout map onto it (see pyproject.toml):
    sglang_obs.exporter   <- exporter/    the exporter daemon (lowest layer)
    sglang_obs.simulator  <- simulator/   a simulated SGLang (uses the exporter only to render)
    sglang_obs.tools      <- sglang_obs/tools/     what an operator runs
    sglang_obs.generate   <- sglang_obs/generate/  what a developer runs to regenerate files
    sglang_obs.config     <- prometheus/, alertmanager/, grafana/  (installed copies)
"""

__version__ = "0.1.0"

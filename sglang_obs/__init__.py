"""sglang-obs: the stack around the exporter — rules, Alertmanager, alert sink, runner."""

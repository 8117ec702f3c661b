"""What a developer runs to regenerate committed files: rules, the detection table, backfills,
dashboard renders."""

"""The demo: a synthetic hospital data set, its config, and a demo analyst."""

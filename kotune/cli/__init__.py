"""The command line's room: argv checks and the Hydra entry (main.py), the console command, conf/'s
resolvers (config.py), overrides and a checkpoint's presets before Hydra composes, one job's run."""

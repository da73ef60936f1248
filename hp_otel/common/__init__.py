"""Small helpers every layer uses: atomic file writing (`files`) and the launchers'
rank, world size and run id variables (`launcher_env`)."""

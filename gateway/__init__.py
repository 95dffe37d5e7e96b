"""The gateway: the only service research agents reach. Runs, keys, operator admin, episode log, leaderboard."""

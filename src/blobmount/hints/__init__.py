"""Read-order hints: a job tells the mount which files it will read next."""

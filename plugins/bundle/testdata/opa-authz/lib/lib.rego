package lib

dangerous(cmd) if regex.match(`\brm\s+-rf\b`, cmd)

dangerous(cmd) if contains(cmd, "mkfs")

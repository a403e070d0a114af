#!/usr/bin/env bash
# A private PostgreSQL cluster for the tests: .ci/run and developers use it.
#
#   eval "$(.ci/postgres.sh start)"   # start (installing Debian's PostgreSQL
#                                     # if missing) and export WICKET_TEST_POSTGRES
#                                     # (and WICKET_PG_STARTED=1 if it started it)
#   go test -race ./...               # the PostgreSQL tests now run
#   .ci/postgres.sh stop              # stop it (the data stays until `clean`)
#   .ci/postgres.sh kill              # stop it at once, as a crash would
#                                     # (pg_ctl -m immediate: tests of an outage)
#   .ci/postgres.sh clean             # stop and remove the cluster
#
# The cluster lives in $WICKET_PG_DIR (default /tmp/wicket-pg-$UID), trusts
# local connections, and listens on a Unix socket in that directory only, so
# clusters of several developers on one machine never collide. Set
# WICKET_PG_PORT to also listen on 127.0.0.1:PORT (benchmarks over TCP).
# Run as root (as CI does), the server runs as the `postgres` user that
# Debian's package creates: PostgreSQL refuses to run as root.
set -euo pipefail

dir=${WICKET_PG_DIR:-/tmp/wicket-pg-$(id -u)}
port=${WICKET_PG_PORT:-5432}
cmd=${1:-start}

pgbin() {
	local d
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [ -x "$d/pg_ctl" ]; then
			echo "$d"
			return 0
		fi
	done
	if command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(command -v pg_ctl)"
		return 0
	fi
	return 1
}

# as runs a command as the cluster's owner.
as() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

install() {
	if pgbin >/dev/null; then
		return 0
	fi
	if [ "$(id -u)" != 0 ]; then
		echo "postgres.sh: PostgreSQL is not installed; run: sudo apt-get install -y postgresql" >&2
		exit 1
	fi
	echo "postgres.sh: installing Debian's postgresql" >&2
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
	# The package may start its own cluster on port 5432; ours does not need it.
	pg_ctlcluster --help >/dev/null 2>&1 && for c in $(pg_lsclusters -h 2>/dev/null | awk '{print $1"/"$2}'); do
		pg_ctlcluster "${c%/*}" "${c#*/}" stop >/dev/null 2>&1 || true
	done
}

dsn() {
	echo "postgres:///postgres?host=$dir&port=$port&user=wicket&sslmode=disable"
}

start() {
	install
	local bin
	bin=$(pgbin)
	if [ ! -d "$dir" ]; then
		mkdir -p "$dir"
		chmod 0755 "$dir"
		[ "$(id -u)" = 0 ] && chown postgres: "$dir"
	fi
	if [ ! -f "$dir/data/PG_VERSION" ]; then
		as "$bin/initdb" -D "$dir/data" -U wicket --auth=trust -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 ||
			{ cat "$dir/initdb.log" >&2; exit 1; }
		local listen="''"
		if [ -n "${WICKET_PG_PORT:-}" ]; then
			listen="'127.0.0.1'"
		fi
		cat >>"$dir/data/postgresql.conf" <<EOF
# .ci/postgres.sh
listen_addresses = $listen
port = $port
unix_socket_directories = '$dir'
max_connections = 400
shared_buffers = 128MB
EOF
	fi
	local started=0
	if ! as "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
		as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null ||
			{ tail -n 20 "$dir/server.log" >&2; exit 1; }
		started=1
	fi
	echo "export WICKET_TEST_POSTGRES='$(dsn)'"
	# Whether this call started the server: a caller stops only a server it
	# started (another run may be using one that was already up).
	echo "export WICKET_PG_STARTED=$started"
}

stop() {
	local bin
	if bin=$(pgbin) && [ -f "$dir/data/PG_VERSION" ]; then
		as "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
	fi
}

kill_() {
	local bin
	bin=$(pgbin)
	as "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
}

case "$cmd" in
start) start ;;
stop) stop ;;
kill) kill_ ;;
clean)
	stop
	rm -rf "$dir"
	;;
dsn) dsn ;;
*)
	echo "usage: $0 start|stop|kill|clean|dsn" >&2
	exit 2
	;;
esac

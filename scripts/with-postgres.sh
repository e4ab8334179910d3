#!/usr/bin/env bash
# Runs a command against a throwaway PostgreSQL server:
#
#     scripts/with-postgres.sh cargo test -p hub --test e2e
#
# The command sees HUB_TEST_DATABASE_URL (postgres://postgres@127.0.0.1:<port>/postgres);
# the test harness then gives each hub a fresh database on that server.
# The cluster lives in a temporary directory (initdb + pg_ctl: no Docker, no
# system service) and is stopped and removed afterwards, also when the
# command fails or is interrupted. With HUB_TEST_DATABASE_URL already set
# (a developer's own server), the command just runs against that server.
#
# With the throwaway cluster the command also sees HUB_TEST_PG_CTL
# ("<pg_ctl> -D <data dir>") and, as root, HUB_TEST_PG_RUNAS (the user
# PostgreSQL runs as, for runuser): tests that stop and start a PostgreSQL
# server (the database outage test) run only then, on a cluster of their
# own made with the same binaries, never on a developer's server.
# On a machine without PostgreSQL, root installs Debian's packages first.
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 <command> [args…]" >&2
    exit 2
fi

if [ -n "${HUB_TEST_DATABASE_URL:-}" ]; then
    unset HUB_TEST_PG_CTL HUB_TEST_PG_RUNAS
    exec "$@"
fi

find_bin() {
    # The newest major version when several are installed.
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

bin="$(find_bin)"
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "$0: PostgreSQL is not installed (/usr/lib/postgresql/*/bin); install Debian's" \
            "postgresql package or set HUB_TEST_DATABASE_URL to a server of yours" >&2
        exit 1
    fi
    apt-get update
    apt-get install -y postgresql
    bin="$(find_bin)"
fi

# initdb refuses to run as root: as root the cluster belongs to Debian's
# `postgres` user (created by the package); anyone else owns their own.
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# initdb's children write to /dev/null as the cluster's owner; a /dev/null
# recreated with root's umask (0644) fails initdb half-way with a cryptic
# "cannot create /dev/null". Its standard mode is 0666.
if [ "$(id -u)" -eq 0 ] && ! runuser -u postgres -- test -w /dev/null; then
    echo "$0: /dev/null is not writable by other users; restoring its mode 0666" >&2
    chmod 0666 /dev/null
fi

dir="$(mktemp -d "${TMPDIR:-/tmp}/hub-pg.XXXXXX")"
if [ "$(id -u)" -eq 0 ]; then
    chown postgres:postgres "$dir"
fi
started=""
cleanup() {
    local status=$?
    if [ -n "$started" ]; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Trust authentication on loopback and a byte-order collation: what the
# suite expects of a scratch server, and the same text order as SQLite.
as_owner "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale \
    >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2
    exit 1
}
mkdir -p "$dir/sock"
if [ "$(id -u)" -eq 0 ]; then
    chown postgres:postgres "$dir/sock"
fi

# A free port: one nothing answers on, retried if another process takes it
# between the check and the start.
port=""
for _ in $(seq 1 20); do
    candidate=$((20000 + RANDOM % 40000))
    if (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
        continue
    fi
    # No fsync: the cluster is thrown away. Connections: the suite runs
    # several hubs at once, each with a pool of its own. A small WAL: each
    # test database's creation writes the template (~8 MB) to it, and the
    # default keeps up to 1 GB of it on disk.
    if as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
        -o "-c listen_addresses=127.0.0.1 -p $candidate -k $dir/sock \
            -c max_connections=500 -c fsync=off -c synchronous_commit=off \
            -c full_page_writes=off -c max_wal_size=128MB -c min_wal_size=32MB" \
        >/dev/null; then
        port="$candidate"
        started=1
        break
    fi
done
if [ -z "$port" ]; then
    echo "$0: the PostgreSQL server did not start:" >&2
    tail -n 20 "$dir/server.log" >&2 || true
    exit 1
fi

export HUB_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
export HUB_TEST_PG_CTL="$bin/pg_ctl -D $dir/data"
if [ "$(id -u)" -eq 0 ]; then
    export HUB_TEST_PG_RUNAS=postgres
else
    unset HUB_TEST_PG_RUNAS
fi
echo "with-postgres.sh: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port" >&2
"$@"

#!/usr/bin/env bash
# Runs BenchmarkSpeed (issue #14; BENCHMARKS.md, "Speed") in several
# processes and prints the medians of its metrics and the ratios between
# configurations, each computed within one process.
#
#   scripts/bench-speed.sh            # RUNS=5 processes of BENCHTIME=2s per configuration
#   RUNS=3 BENCHTIME=1s scripts/bench-speed.sh
#   scripts/bench-speed.sh strace     # fsyncs/op, WAL frames/op and checkpointed pages/op, with strace
#
# Outputs go to $OUT (a new temporary directory by default): run1.txt … and
# the idem.test binary. The strace mode needs strace (5.3 or later); the
# benchmark itself does not.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
BENCHTIME=${BENCHTIME:-2s}
OUT=${OUT:-$(mktemp -d -t idem-speed-XXXXXX)}
mkdir -p "$OUT"
go test -c -o "$OUT/idem.test" .
echo "outputs in $OUT" >&2

if [[ ${1:-} == strace ]]; then
	# fsyncs made by the whole process, SQLite's checkpoints and WAL header
	# syncs included, per operation: the difference between a run of
	# HI and one of LO operations, so that what a run does once (opening
	# the journal, run1's single operation) cancels out.
	LO=${LO:-500} HI=${HI:-2500}
	# Also WAL frames (4-KiB pwrite64s to a -wal file) and pages written
	# to the database file itself (checkpoints), per operation (issue #24).
	count() { # benchmark regexp, iterations → "fsyncs frames dbpages"
		strace -f -y --seccomp-bpf -e trace=fsync,fdatasync,pwrite64 -o "$OUT/strace.txt" \
			"$OUT/idem.test" -test.run '^$' -test.bench "$1" -test.benchtime "$2x" >/dev/null
		awk '/ (fsync|fdatasync)\(/ { s++ }
			/ pwrite64\(.*-wal>, .*, 4096, / { f++; next }
			/ pwrite64\(.*\.db>, .*, 4096, / { p++ }
			END { print s + 0, f + 0, p + 0 }' "$OUT/strace.txt"
	}
	printf '%-28s %8s %12s %12s %12s\n' configuration callers fsyncs/op wal-frames/op db-pages/op
	for cfg in naive idem; do
		for callers in 1 16 64; do
			re="^BenchmarkSpeed\$/^$cfg\$/^callers=$callers\$"
			lo=$(count "$re" "$LO")
			hi=$(count "$re" "$HI")
			awk -v c="$cfg" -v n="$callers" -v hi="$hi" -v lo="$lo" -v d=$((HI - LO)) \
				'BEGIN { split(hi, h, " "); split(lo, l, " ")
					printf "%-28s %8d %12.3f %12.3f %12.3f\n", c, n, (h[1] - l[1]) / d, (h[2] - l[2]) / d, (h[3] - l[3]) / d }'
		done
	done
	exit 0
fi

for i in $(seq 1 "$RUNS"); do
	"$OUT/idem.test" -test.run '^$' -test.bench '^BenchmarkSpeed$' -test.benchtime "$BENCHTIME" | tee "$OUT/run$i.txt"
done
go run ./internal/cmd/benchratio \
	-ratio idem:naive -ratio idem:plain -ratio memory:plain -ratio naive:plain \
	-ratio memory-floor:plain -ratio memory:memory-floor \
	-ratio idem-ordered-keys:idem \
	-ratio callers=64:callers=16 \
	-added idem/callers=1:plain/callers=1:fsync \
	-added naive/callers=1:plain/callers=1:fsync \
	"$OUT"/run*.txt

#!/usr/bin/env bash
# ci/shape.sh [--list N] [DIR...] — the code-shape rule of docs/testing.md for core/ and
# oracle/: every function at most 80 lines, every file at most 700. A function is counted
# from the line that opens its definition at column 0 to its closing '}' at column 0.
# --list N prints the N longest functions instead of enforcing. Exit 1 on a breach.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_FN=80 MAX_FILE=700 list=0
if [ "${1:-}" = "--list" ]; then list=${2:?--list N}; shift 2; fi
dirs=("$@"); [ ${#dirs[@]} -gt 0 ] || dirs=(core oracle)
files=$(find "${dirs[@]}" -maxdepth 1 -name '*.c' -o -maxdepth 1 -name '*.h' | sort)
# awk: a definition starts at a column-0 line that is not a comment, a preprocessor line, a
# brace or a declaration ending in ';', and whose body opens with '{' at the end of a line.
lens=$(awk '
  FNR == 1 { start = 0; inbody = 0 }
  !inbody && /^[A-Za-z_]/ && !/;[ \t]*$/ && !/^(typedef|struct [A-Za-z_]+ *\{|enum|union)/ && !start {
    start = FNR; name = $0; sub(/\(.*/, "", name); n = split(name, w, /[ *]+/); name = w[n]
  }
  start && !inbody && /\{.*\}[ \t]*;?[ \t]*$/ { start = 0; next }  # a one-line definition
  start && !inbody && /\{[ \t]*$/ { inbody = 1 }
  start && !inbody && /;[ \t]*$/ { start = 0 }
  inbody && /^\}/ { printf "%d %s:%d %s\n", FNR - start + 1, FILENAME, start, name; start = 0; inbody = 0 }
' $files | sort -rn)
if [ "$list" -gt 0 ]; then echo "$lens" | head -n "$list"; exit 0; fi
bad=0
while read -r n where name; do
  [ -n "$n" ] || continue
  if [ "$n" -gt "$MAX_FN" ]; then echo "ci/shape.sh: $where $name is $n lines (at most $MAX_FN)"; bad=1; fi
done <<<"$lens"
for f in $files; do
  n=$(wc -l <"$f")
  if [ "$n" -gt "$MAX_FILE" ]; then echo "ci/shape.sh: $f is $n lines (at most $MAX_FILE)"; bad=1; fi
done
[ "$bad" -eq 0 ] && echo "ci/shape.sh: ${dirs[*]}: every function <= $MAX_FN lines, every file <= $MAX_FILE"
exit "$bad"

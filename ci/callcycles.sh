#!/usr/bin/env bash
# ci/callcycles.sh BUILD_DIR [SUBDIR] — the layering rule of docs/testing.md: no two source
# files of oracle/ (or SUBDIR) call each other, directly or through others. Reads the object
# files' symbol tables (nm): file A depends on B when A uses a function B defines. Prints each
# cycle found, and exits 1 if there is one.
set -euo pipefail
build=${1:?usage: ci/callcycles.sh BUILD_DIR [SUBDIR]} sub=${2:-oracle}
objs=$(find "$build/$sub" -name '*.c.o' | sort)
[ -n "$objs" ] || { echo "ci/callcycles.sh: no objects under $build/$sub" >&2; exit 2; }
# "def FILE SYMBOL" and "use FILE SYMBOL" lines, FILE the source's name (compare.c)
for o in $objs; do
  f=$(basename "$o" .o)
  nm "$o" | awk -v f="$f" '$2 ~ /^[TD]$/ { print "def", f, $3 } $1 == "U" { print "use", f, $2 }'
done | awk '
  $1 == "def" { owner[$3] = $2; next }
  { uses[++n] = $2 " " $3 }
  END {
    for (i = 1; i <= n; i++) {
      split(uses[i], u, " ")
      if ((u[2] in owner) && owner[u[2]] != u[1]) edge[u[1] " " owner[u[2]]] = u[2]
    }
    for (e in edge) { split(e, p, " "); adj[p[1]] = adj[p[1]] " " p[2]; nodes[p[1]]; nodes[p[2]] }
    # a cycle is a back edge of a depth-first search
    bad = 0
    for (s in nodes) if (!(s in color)) bad += dfs(s, "")
    if (!bad) print "ci/callcycles.sh: no call cycle between the files"
    exit bad > 0
  }
  function dfs(v, path,   k, m, w, nb, found) {
    color[v] = 1; path = path " " v; found = 0
    m = split(adj[v], nb, " ")
    for (k = 1; k <= m; k++) {
      w = nb[k]
      if ((w in color) && color[w] == 1) { print "ci/callcycles.sh: call cycle:" substr(path, index(path, " " w " ")) " -> " w " (" edge[v " " w] ")"; found++ }
      else if (!(w in color)) found += dfs(w, path)
    }
    color[v] = 2
    return found
  }'

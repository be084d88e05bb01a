#!/usr/bin/env bash
# header_selfcontained.sh BUILD_DIR CC MPI_INCLUDE_DIRS — installs the build
# into a temporary prefix and proves the installed contract headers are
# self-contained and exactly impl.h's closure:
#  - `#include <fsdpcheck/impl.h>` and each installed header alone compile
#    (C11, and C++ where a C++ compiler is found) with only -I<prefix>/include
#    and the MPI include path, -Wall -Wextra -Werror -pedantic;
#  - nothing from cJSON or OpenSSL is included;
#  - the headers impl.h pulls in are exactly the files installed under
#    include/fsdpcheck/, no more, no less.
set -u
build=$1 cc=$2 mpi_inc=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/p" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
inc="-I$tmp/p/include"
IFS=';' read -ra dirs <<<"$mpi_inc"
for d in "${dirs[@]}"; do [ -n "$d" ] && inc="$inc -I$d"; done
fail=0
printf '#include <fsdpcheck/impl.h>\nconst fc_impl_ops *fsdpcheck_impl_v1(void);\nint main(void) { return FC_IMPL_ABI_VERSION == 1 ? 0 : 1; }\n' >"$tmp/t.c"
# shellcheck disable=SC2086
$cc -std=c11 -Wall -Wextra -Werror -pedantic $inc -M "$tmp/t.c" >"$tmp/deps" 2>&1 || { cat "$tmp/deps"; exit 1; }
if grep -Eiq 'cjson|openssl' "$tmp/deps"; then
  echo "FAIL: <fsdpcheck/impl.h> includes cJSON or OpenSSL headers:"; grep -Eio '[^ ]*(cjson|openssl)[^ ]*' "$tmp/deps" | sort -u
  fail=1
fi
tr ' \\' '\n\n' <"$tmp/deps" | grep "^$tmp/p/include/fsdpcheck/" | sed "s|.*/||" | sort -u >"$tmp/needed"
(cd "$tmp/p/include/fsdpcheck" && ls) | sort >"$tmp/installed"
if ! diff "$tmp/needed" "$tmp/installed" >"$tmp/diff"; then
  echo "FAIL: installed headers differ from impl.h's closure (< needed, > installed):"; cat "$tmp/diff"; fail=1
fi
for h in $(cat "$tmp/installed"); do
  printf '#include <fsdpcheck/%s>\n#include <fsdpcheck/%s>\ntypedef int fc_nonempty_unit;\n' "$h" "$h" >"$tmp/one.c"
  # shellcheck disable=SC2086
  $cc -std=c11 -Wall -Wextra -Werror -pedantic $inc -fsyntax-only "$tmp/one.c" || { echo "FAIL: <fsdpcheck/$h> alone (C)"; fail=1; }
  if command -v c++ >/dev/null; then
    # shellcheck disable=SC2086
    c++ -x c++ -std=c++17 -Wall -Wextra -Werror $inc -fsyntax-only "$tmp/one.c" || { echo "FAIL: <fsdpcheck/$h> alone (C++)"; fail=1; }
  fi
done
[ $fail -eq 0 ] || exit 1
echo "ok: <fsdpcheck/impl.h> compiles with only -I<prefix>/include and MPI's include path; installed = its closure: $(tr '\n' ' ' <"$tmp/installed")"

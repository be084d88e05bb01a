#!/usr/bin/env bash
# tests/mutation/rules.sh — mutation testing of FSDP's rules (core/layout.c).
#
# Each mutant flips one rule or puts it off by one: every function of
# core/layout.h and the divide factors. The tree is copied to a scratch folder
# and built once (Release, no CUDA); then, per mutant, core/layout.c is
# patched, fsdpcheck rebuilt (one file and a link), and the gate run: the
# default sweep's draw at W = 4 (seed 4242, 40 cases over W = 1..4, every
# strategy, prefetch, limiter, accumulation, hybrid). A mutant is caught when
# the gate fails; the line names the property that caught it. Prints
#   rules mutants caught: X/Y
# and exits 1 below Y/Y (2 on a usage or build error).
#
# No mutation tool is used: the C ones (mull, dextool) need LLVM plugins that
# Debian 12 does not package, and each mutant here is a rule flip chosen to be
# non-equivalent, written as the exact text it replaces (a patch that no longer
# applies is an error, so the list cannot silently rot).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CASES=${FC_MUTATION_CASES:-40}
W=${FC_MUTATION_W:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HWLOC_COMPONENTS=-pci,-x86

# NAME@@the exact text in core/layout.c (\n: a newline)@@its replacement
MUTANTS=(
  'sharded: no_shard gathers@@return s != FC_STRATEGY_LOCAL && s != FC_STRATEGY_NO_SHARD; }@@return s != FC_STRATEGY_LOCAL; }'
  'hybrid: hybrid_shard_zero2 not hybrid@@return s == FC_STRATEGY_HYBRID_SHARD || s == FC_STRATEGY_HYBRID_SHARD_ZERO2;@@return s == FC_STRATEGY_HYBRID_SHARD;'
  'reshards: ZeRO-2 frees after forward (issue 21)@@return s == FC_STRATEGY_FULL_SHARD || s == FC_STRATEGY_HYBRID_SHARD; }@@return s != FC_STRATEGY_LOCAL && s != FC_STRATEGY_NO_SHARD; }'
  'reshards: hybrid_shard keeps after forward@@return s == FC_STRATEGY_FULL_SHARD || s == FC_STRATEGY_HYBRID_SHARD; }@@return s == FC_STRATEGY_FULL_SHARD; }'
  'groups: hybrid ignores --shard-group@@g.hybrid && cfg->shard_group ? cfg->shard_group : W;@@W;'
  'groups: strided shard groups@@g.shard_rank = rank % g.F;@@g.shard_rank = rank / g.R;'
  'groups: replica off by one@@g.replica = rank / g.F;@@g.replica = (rank + 1) % g.R;'
  'chunk size: rounds n/G + 1@@return (n + (size_t)G - 1) / (size_t)G;@@return (n + (size_t)G) / (size_t)G;'
  'flat chunk: padding counted as valid@@(n - a < S ? n - a : S)@@S'
  'layout: no_shard stores a shard@@l.store = g->sharded ? l.shard : numel;@@l.store = l.shard;'
  'stages: backward starts at the first forward stage@@st.first_bwd = st.last_fwd;@@st.first_bwd = st.first_fwd;'
  'reshard: the root freed after forward@@return fc_strategy_reshards(s) && u != m->root_unit;@@return fc_strategy_reshards(s) && u != m->n_units;'
  'next forward unit: skips a stage@@for (int t = s + 1; t < m->n_stages; t++) {@@for (int t = s + 2; t < m->n_stages; t++) {'
  'next backward unit: skips a stage@@for (int t = s - 1; t >= 0; t--) {@@for (int t = s - 2; t >= 0; t--) {'
  'limiter: three gathered@@return !cfg->limit_all_gathers || alive < 2;@@return !cfg->limit_all_gathers || alive < 3;'
  'predivide: F / f >= f@@while (fmod(F, f) == 0 && F / f > f) f *= 2;@@while (fmod(F, f) == 0 && F / f >= f) f *= 2;'
  'divide avg: post-divides@@*pre = F, *post = 1.0;@@*pre = 1.0, *post = F;'
  'divide sum-then-divide: pre-divides@@*pre = 1.0, *post = F;\n        return;@@*pre = F, *post = 1.0;\n        return;'
  'divide factor: set_gradient_divide_factor ignored@@return cfg->gradient_divide_factor > 0 ? cfg->gradient_divide_factor : (double)W;@@return ((void)cfg, (double)W);'
  'prefetch lists: one unit short@@for (int t = s; k < n;) {@@for (int t = s; k < n - 1;) {'
  'backward lists: FSDP2 always one ahead@@return cfg->backward_prefetch_depth > 1 ? cfg->backward_prefetch_depth : 1;@@return 1;'
  'rank samples: reversed@@*first = rank * *count;@@*first = (W - 1 - rank) * *count;'
  'checkpointing: the root recomputes too@@return c->act_ckpt != FC_ACT_CKPT_NONE && u != m->root_unit;@@return c->act_ckpt != FC_ACT_CKPT_NONE && u != m->n_units;'
  'frozen store: a frozen FlatParameter keeps its padding@@fc_model_trainable_in(m, u, l.own_off, l.own_valid) : l.store;@@fc_model_trainable_in(m, u, l.own_off, l.own_valid) : l.own_valid;'
  'frozen store: FSDP2 counts real rows@@if (p->frozen) n += fc_chunk_size(d0, g->G) * (p->numel / d0);@@if (p->frozen) n += d0 / (size_t)g->G * (p->numel / d0);'
  'recompute: outside never gathers@@c->act_ckpt == FC_ACT_CKPT_OUTSIDE && c->fsdp_version == 1 &&@@c->act_ckpt == FC_ACT_CKPT_OUTSIDE && c->fsdp_version == 0 &&'
)

echo "== rules mutation: copying the tree, building fsdpcheck (Release, no CUDA)"
(cd "$ROOT" && git ls-files -z | xargs -0 -I{} cp --parents {} "$work/") 2>/dev/null || {
  # not a git checkout: the whole tree but build outputs
  tar -C "$ROOT" --exclude=./build --exclude=./out --exclude='./.venv*' -cf - . | tar -C "$work" -xf -
}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$work" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFC_CUDA=OFF >"$work/cfg.log" 2>&1 ||
  { tail -20 "$work/cfg.log"; echo "rules.sh: configure failed" >&2; exit 2; }
build() { cmake --build "$work/build" -j "$(nproc)" --target fsdpcheck >"$work/build.log" 2>&1; }
build || { tail -20 "$work/build.log"; echo "rules.sh: the unmutated build failed" >&2; exit 2; }
bin=$work/build/oracle/fsdpcheck
orig=$work/core/layout.c.orig
cp "$work/core/layout.c" "$orig"
# --timeout 60: a case takes well under a second; a mutant that hangs the
# ranks (no_shard storing a shard overruns its buffers) is caught by the
# watchdog in a minute, not in its default ten
gate() { mpiexec -n "$W" "$bin" sweep --cases "$CASES" --seed 4242 --timeout 60 >"$work/gate.log" 2>&1; }
gate || { tail -20 "$work/gate.log"; echo "rules.sh: the gate fails without a mutant" >&2; exit 2; }
echo "unmutated: the gate passes ($(grep -o '[0-9]* passed, [0-9]* failed' "$work/gate.log" | tail -1))"

caught=0 total=0
for m in "${MUTANTS[@]}"; do
  name=${m%%@@*} rest=${m#*@@}
  from=${rest%%@@*} to=${rest#*@@}
  total=$((total + 1))
  # the literal text (perl's \Q...\E), which must occur exactly once
  if ! FROM=$from TO=$to perl -0pi -e '
      my ($f, $t) = ($ENV{FROM}, $ENV{TO});
      $f =~ s/\\n/\n/g; $t =~ s/\\n/\n/g;
      my $n = () = /\Q$f\E/g;
      die "matches $n times\n" unless $n == 1;
      s/\Q$f\E/$t/;' "$work/core/layout.c" 2>"$work/patch.err"; then
    echo "rules.sh: mutant '$name' does not apply to core/layout.c ($(cat "$work/patch.err"))" >&2
    exit 2
  fi
  if ! build; then
    echo "rules.sh: mutant '$name' does not build:" >&2
    tail -5 "$work/build.log" >&2
    exit 2
  fi
  if gate; then
    echo "MISSED  $name: the gate passed"
  else
    caught=$((caught + 1))
    by=$(grep -m1 -o 'caught by P[0-9]*[^)]*)' "$work/gate.log" || grep -m1 -E 'FAIL|error|fsdpcheck' "$work/gate.log" | cut -c1-150)
    rule=$(grep -m1 -o 'rules: [^;]*' "$work/gate.log" | cut -c1-150 || true)
    echo "caught  $name: ${by:-the gate failed}${rule:+; $rule}"
  fi
  cp "$orig" "$work/core/layout.c"
done
build || { echo "rules.sh: the restored build failed" >&2; exit 2; }
echo "rules mutants caught: $caught/$total"
[ "$caught" -eq "$total" ]

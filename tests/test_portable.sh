#!/usr/bin/env bash
# Programs are portable across thread counts: a program compiled by a process with
# N threads loads (nothing recompiled) in a process with M threads, and draws the
# same picture as that process builds without any program. Run on every oneDNN /
# kernel path this CPU has (lower ones forced with ONEDNN_MAX_CPU_ISA and
# DIFFLET_KERNELS), for f32 and bf16, compiling under 2 threads and loading under 1,
# and the reverse.
set -u
bin=$1
data=${2:-tests/data}
model="$data/flux/dev"
tmpd=$(mktemp -d); trap 'rm -rf "$tmpd"' EXIT
pass=0; fail=0
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
paths=("native:")
has avx2 && paths+=("avx2:ONEDNN_MAX_CPU_ISA=AVX2 DIFFLET_KERNELS=avx2")
has avx512f && paths+=("avx512:ONEDNN_MAX_CPU_ISA=AVX512_CORE DIFFLET_KERNELS=avx512")
has avx512_bf16 && paths+=("avx512-bf16:ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 DIFFLET_KERNELS=avx512")
gen=(generate --model "$model" --prompt "a red circle" --width 32 --height 48 --steps 2
     --max-sequence-length 32 --seed 3)
for p in "${paths[@]}"; do
    name=${p%%:*}; envs=${p#*:}
    for dt in f32 bf16; do
        for tt in "2 1" "1 2"; do
            set -- $tt; tc=$1; tl=$2
            cache="$tmpd/cache-$name-$dt-$tc"
            what="$name $dt: compiled with $tc threads, loaded with $tl"
            if ! env $envs DIFFLET_CACHE="$cache" OMP_NUM_THREADS=$tc "$bin" compile --model "$model" --size 32x48 \
                  --max-sequence-length 32 --dtype $dt > "$tmpd/c.log" 2>&1; then
                fail=$((fail+1)); echo "FAIL: $what: compile: $(tail -3 "$tmpd/c.log")"; continue
            fi
            if ! env $envs DIFFLET_CACHE="$cache" OMP_NUM_THREADS=$tl "$bin" "${gen[@]}" --dtype $dt \
                  -o "$tmpd/load.png" > "$tmpd/l.log" 2>&1; then
                fail=$((fail+1)); echo "FAIL: $what: $(grep -m3 difflet "$tmpd/l.log")"; continue
            fi
            if grep -qiE "compiled |recompil" "$tmpd/l.log"; then
                fail=$((fail+1)); echo "FAIL: $what: the load compiled: $(grep -iE 'compiled |recompil' "$tmpd/l.log")"
                continue
            fi
            env $envs OMP_NUM_THREADS=$tl "$bin" "${gen[@]}" --dtype $dt --no-cache -o "$tmpd/fresh.png" > /dev/null 2>&1
            if cmp -s "$tmpd/load.png" "$tmpd/fresh.png"; then pass=$((pass+1));
            else fail=$((fail+1)); echo "FAIL: $what: the picture differs from the one built without a program"; fi
        done
    done
done
echo "test_portable: paths ${paths[*]%%:*}; $pass passed, $fail failed"
[ "$fail" = 0 ]

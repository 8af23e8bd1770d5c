#!/usr/bin/env bash
# Argument errors give one line on stderr and a non-zero exit; help and version work.
set -u
bin=$1
data=${2:-tests/data}
tmpd=$(mktemp -d); trap 'rm -rf "$tmpd"' EXIT
pass=0; fail=0
expect() { # expect <want-exit> <stderr-substring> <args...>
    local want=$1 sub=$2; shift 2
    err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
    if [ "$rc" = "$want" ] && [[ "$err" == *"$sub"* ]]; then pass=$((pass+1));
    else fail=$((fail+1)); echo "FAIL: difflet $* -> exit $rc, stderr: $err (want $want, '$sub')"; fi
}
expect 2 "unknown command" frobnicate
expect 2 "usage" 
expect 2 "needs a target" bench
expect 2 "unknown bench target" bench nothing
expect 2 "unknown option" bench kernels --bogus
expect 0 "" version
expect 2 "needs one path" inspect
expect 1 "does not exist" inspect /nonexistent/model
printf 'garbage!!garbage' > "$tmpd/bad.safetensors"
expect 1 "not a safetensors file" inspect "$tmpd/bad.safetensors"
printf '\x10\0\0\0\0\0\0\0{"a":{"dtype":"F3' > "$tmpd/trunc.safetensors"
expect 1 "not a JSON object" inspect "$tmpd/trunc.safetensors"
expect 0 "" inspect "$data/io/py_basic.safetensors"
expect 0 "" inspect "$data/io/clip_sharded/model.safetensors.index.json"
expect 0 "" --help
out=$("$bin" version) && [[ "$out" == difflet* ]] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: version output: $out"; }
echo "test_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]

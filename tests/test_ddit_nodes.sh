#!/bin/bash
# DDiT on two emulated nodes: two Linux network namespaces joined by a veth pair, each
# with its own address and host name, and Open MPI over TCP between them (mpirun's
# rsh agent enters the host's namespace; no shared memory crosses them). The world:
# the scheduler and units 0-1 on node0, units 2-3 on node1. `difflet ddit` finds the
# nodes from the host names, never lets a group span them (2 nodes x 2 units), and
# every request's frames equal the same request at a static DoP 1 on one machine
# (PSNR >= 50 dB, identical where the layout allows).
#
#   tests/test_ddit_nodes.sh path/to/difflet tests/data
# Needs root (ip netns), iproute2 and Open MPI; skipped with a note otherwise.
set -u
bin=$(readlink -f "$1") data=$(readlink -f "$2")
if ! command -v mpirun >/dev/null || ! command -v ip >/dev/null || ! command -v unshare >/dev/null || [ "$(id -u)" != 0 ]; then
    echo "test_ddit_nodes: skipped (needs root, iproute2, unshare and mpirun)"; exit 0
fi
tag=dl$$ tmpd=$(mktemp -d) ns0=dl$$n0 ns1=dl$$n1 net=10.77.$(( $$ % 200 + 20 ))
cleanup() {
    ip netns del "$ns0" 2>/dev/null; ip netns del "$ns1" 2>/dev/null
    rm -rf "/etc/netns/$ns0" "/etc/netns/$ns1" "$tmpd"
}
trap cleanup EXIT
if ! ip netns add "$ns0" 2>/dev/null || ! ip netns add "$ns1" || ! ip link add "${tag}a" type veth peer name "${tag}b" ||
   ! ip link set "${tag}a" netns "$ns0" || ! ip link set "${tag}b" netns "$ns1"; then
    echo "test_ddit_nodes: skipped (cannot make network namespaces here)"; exit 0
fi
ip -n "$ns0" addr add "$net.1/24" dev "${tag}a" && ip -n "$ns1" addr add "$net.2/24" dev "${tag}b"
for n in "$ns0" "$ns1"; do ip -n "$n" link set lo up; done
ip -n "$ns0" link set "${tag}a" up && ip -n "$ns1" link set "${tag}b" up
for n in "$ns0" "$ns1"; do mkdir -p "/etc/netns/$n"; printf '127.0.0.1 localhost\n%s.1 node0\n%s.2 node1\n' "$net" "$net" > "/etc/netns/$n/hosts"; done
cat > "$tmpd/agent" <<EOF
#!/bin/sh
# Open MPI's rsh agent: \`agent [options] HOST command...\` in HOST's namespace, named HOST
while [ \$# -gt 0 ]; do case "\$1" in -*) shift;; *) break;; esac; done
host=\$1; shift
case "\$host" in node0|$net.1) ns=$ns0;; node1|$net.2) ns=$ns1;; *) echo "agent: unknown host \$host" >&2; exit 1;; esac
exec ip netns exec \$ns unshare --uts sh -c "hostname \$host; exec \$*"
EOF
chmod +x "$tmpd/agent"
printf 'node0 slots=3\nnode1 slots=2\n' > "$tmpd/hosts"
printf 'resolution,phase,dop,seconds\n40p,dit,1,0.13\n40p,dit,2,0.08\n40p,vae,1,0.2\n80p,dit,1,0.39\n80p,dit,2,0.23\n80p,vae,1,1.0\n' > "$tmpd/dd.csv"
export DIFFLET_PROFILES="$tmpd/profiles.db"
"$bin" profile import "$tmpd/dd.csv" --name dd >/dev/null || { echo "FAIL: profile import"; exit 1; }
dd=(ddit --model "$data/opensora/a" --sizes 56x40,112x80 --frames 34 --profile dd --steps 12 --requests 8 --mix 1:1)
pass=0 fail=0
# the two nodes: scheduler + 2 units on node0, 2 units on node1
out=$(timeout 300 ip netns exec "$ns0" unshare --uts sh -c "hostname node0; exec mpirun --allow-run-as-root --oversubscribe \
      --bind-to none --hostfile $tmpd/hosts --mca plm_rsh_agent $tmpd/agent --mca oob_tcp_if_include $net.0/24 \
      --mca btl_tcp_if_include $net.0/24 --mca btl tcp,self -x DIFFLET_PROFILES -x OMP_NUM_THREADS=1 -np 5 \
      $bin ${dd[*]} --units 4 --out $tmpd/two" 2>&1)
if [[ "$out" == *"completed 8  failed 0  (2 nodes x 2 units)"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: two nodes: $out"; fi
# no group spans the nodes: the largest DoP is 2
if ! grep -q "DoP 4" <<< "$out"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: a group of 4 across the nodes: $out"; fi
# the same requests on one machine, one unit each
out1=$("$bin" "${dd[@]}" --units 2 --policy sdop:1 --out "$tmpd/one" 2>&1)
got=$(python3 "$(dirname "$(readlink -f "$0")")/rgb_psnr.py" "$tmpd/two" "$tmpd/one" 8)
if [ "$got" = identical ] || awk -v p="$got" 'BEGIN { exit !(p >= 50) }'; then pass=$((pass+1));
else fail=$((fail+1)); echo "FAIL: two nodes' outputs against one machine's DoP 1: worst PSNR $got: $out1"; fi
# serve with the same world: its model process's mpirun gets the host file and the agent
cat > "$tmpd/serve.py" <<'PY'
import os, sys, time
sys.path.insert(0, sys.argv[3])
from serve_util import Server, check, counts
tmp, bin_, _, data, hosts, agent, net = sys.argv[1:8]
dep = {"model": os.path.join(data, "opensora", "a"), "sizes": ["56x40", "112x80"], "frames": [34], "scheduler": "ddit",
       "units": 4, "ddit_profile": "dd", "results_dir": os.path.join(tmp, "serve"), "port": 0, "request_timeout_s": 120,
       "mpirun_hostfile": hosts,
       "mpirun_args": f"--mca plm_rsh_agent {agent} --mca oob_tcp_if_include {net}.0/24 --mca btl_tcp_if_include {net}.0/24 "
                      "--mca btl tcp,self"}
s = Server(bin_, os.path.join(tmp, "serve"), dep, suffix="deployment")
check(s.wait_ready(120), "the two-node DDiT world gets ready")
ids = []
for i in range(4):
    st, v = s.json("POST", "/v1/videos", {"prompt": "a red fox", "size": ["56x40", "112x80"][i % 2], "frames": 34,
                                          "steps": 12, "seed": i})
    ids.append(v["id"] if st == 200 else None)
for vid in ids:
    d = s.wait_done(f"/v1/videos/{vid}", 120) if vid else None
    check(d and d["status"] == "completed", f"a video on two nodes: {d}")
st, body, _ = s.req("GET", "/metrics")
t = body.decode()
check('difflet_ddit_units{model="a"} 4' in t and 'difflet_ddit_nodes{model="a"} 2' in t
      and 'difflet_ddit_requests_total{model="a",dop="4"} 0' in t,
      f"/metrics: 4 units, no group of 4 across the nodes: {t[-700:]}")
s.stop()
p, f = counts()
print(f"serve on two nodes: {p} passed, {f} failed")
sys.exit(1 if f else 0)
PY
out=$(timeout 300 ip netns exec "$ns0" unshare --uts sh -c "hostname node0; exec python3 $tmpd/serve.py $tmpd $bin \
      $(dirname "$(readlink -f "$0")") $data $tmpd/hosts $tmpd/agent $net" 2>&1)
if [[ "$out" == *"serve on two nodes: "*" 0 failed"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: serve on two nodes: $out"; fi
echo "test_ddit_nodes: $pass passed, $fail failed (worst PSNR against one machine: $got)"
[ "$fail" = 0 ]

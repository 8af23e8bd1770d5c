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
expect 2 "unknown option" bench wan-step --bogus
expect 2 "unknown option" bench hunyuan-step --bogus
expect 2 "unknown option" bench int8-step --bogus
expect 2 "unknown option" bench ltx2-step --bogus
# bench wan-step --quick, difflet's half (the diffusers peer is skipped: it needs the tools venv and time)
out=$(DIFFLET_BENCH_PEER=off "$bin" bench wan-step --quick --no-vae --json "$tmpd/wan.json" 2>&1) && [[ "$out" == *"diffusers: not measured"* ]] && grep -q '"attention_share"' "$tmpd/wan.json" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: bench wan-step --quick: $out"; }
out=$(DIFFLET_BENCH_PEER=off "$bin" bench qwen-step --quick --json "$tmpd/qwen.json" 2>&1) && [[ "$out" == *"diffusers: not measured"* ]] && grep -q '"attention_share"' "$tmpd/qwen.json" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: bench qwen-step --quick: $out"; }
expect 0 "" version
expect 2 "needs one path" inspect
expect 1 "does not exist" inspect /nonexistent/model
printf 'garbage!!garbage' > "$tmpd/bad.safetensors"
expect 1 "not a safetensors file" inspect "$tmpd/bad.safetensors"
printf '\x10\0\0\0\0\0\0\0{"a":{"dtype":"F3' > "$tmpd/trunc.safetensors"
expect 1 "not a JSON object" inspect "$tmpd/trunc.safetensors"
expect 0 "" inspect "$data/io/py_basic.safetensors"
# generate: argument errors (exit 2), bad input at load (exit 1), a real run
flux="$data/flux/dev"
expect 2 "--prompt TEXT is required" generate --model "$flux"
expect 2 "--steps: \`steps\` must be an integer from 1 to 10000" generate --model "$flux" --prompt x --steps 0
expect 2 "--guidance: \`guidance_scale\` must be a number in 0..100" generate --model "$flux" --prompt x --guidance 101
expect 2 "--prompt: \`prompt\` is not valid UTF-8" generate --model "$flux" --prompt $'\xff\xfe'
expect 2 "--seed" generate --model "$flux" --prompt x --seed 9007199254740992
expect 2 "must be f32, bf16, int8 or int8-wo" generate --model "$flux" --prompt x --dtype f64
expect 2 "unknown option" generate --model "$flux" --prompt x --frobnicate 1
expect 1 "multiples of 4" generate --model "$flux" --prompt x --width 30 --height 32 --max-sequence-length 32
expect 1 "does not exist" generate --model /nonexistent --prompt x
out="$tmpd/a.png"
expect 0 "denoise" generate --model "$flux" --prompt "a red circle" --width 32 --height 48 --steps 3 \
  --max-sequence-length 32 --seed 7 -o "$out"
if head -c 8 "$out" 2>/dev/null | od -An -c | grep -q "P   N   G"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $out is not a PNG"; fi
# honest refusals (README status table): no separate probe program, no video models
expect 2 "no separate probe program" compile --model "$flux" --probe
expect 2 "makes images: --frames must be 1" compile --model "$flux" --frames 9
# media outputs: the format from the extension, read back by ffprobe
gen=(generate --model "$flux" --prompt "a red circle" --width 32 --height 48 --steps 2 --max-sequence-length 32 --seed 7)
for f in "jpg mjpeg" "webp webp" "png png"; do
    set -- $f
    expect 0 "" "${gen[@]}" --output-compression 75 -o "$tmpd/m.$1"
    got=$(ffprobe -v error -show_entries stream=codec_name,width,height -of csv=p=0 "$tmpd/m.$1" 2>&1)
    if [ "$got" = "$2,32,48" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: -o m.$1 reads back as '$got'"; fi
done
expect 2 "unknown output format" "${gen[@]}" -o "$tmpd/m.gif"
expect 2 "makes images: write .png" "${gen[@]}" -o "$tmpd/m.mp4"
expect 2 "makes images: --frames must be 1" "${gen[@]}" --frames 9 -o "$tmpd/m.png"
expect 2 "must be an integer in 0..100" "${gen[@]}" --output-compression 101
expect 1 "makes no sound" "${gen[@]}" --save-audio "$tmpd/a.wav" -o "$tmpd/m.png"
expect 0 "" "${gen[@]}" --save-frames "$tmpd/frames" -o "$tmpd/m2.png"
mode=$(umask 022; "$bin" "${gen[@]}" -o "$tmpd/mode.png" >/dev/null 2>&1; stat -c %a "$tmpd/mode.png")
if [ "$mode" = 644 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: a picture written under umask 022 has mode $mode, not 644"; fi
if cmp -s "$tmpd/frames/frame_0000.png" "$tmpd/m2.png"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: --save-frames frame_0000.png is not the picture"; fi
# Wan 2.1 (tests/data/wan/a): an MP4 read back by ffprobe (codec, size, frame rate, frame count)
wgen=(generate --model "$data/wan/a" --prompt "a red circle moving" --width 48 --height 32 --frames 9 --steps 2
      --max-sequence-length 16 --seed 3)
expect 0 "" "${wgen[@]}" --fps 12 -o "$tmpd/v.mp4" --save-frames "$tmpd/vf"
got=$(ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=codec_name,width,height,pix_fmt,r_frame_rate,nb_read_frames \
      -of default=nw=1 "$tmpd/v.mp4" 2>&1 | sort | tr '\n' ' ')
want="codec_name=h264 height=32 nb_read_frames=9 pix_fmt=yuv420p r_frame_rate=12/1 width=48 "
if [ "$got" = "$want" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: v.mp4 reads back as '$got', not '$want'"; fi
if [ -f "$tmpd/vf/frame_0008.png" ] && [ ! -e "$tmpd/vf/frame_0009.png" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: --save-frames did not write 9 frames"; fi
expect 0 "rounded to 9" "${wgen[@]}" --frames 8 -o "$tmpd/v8.mp4"
got=$(ffprobe -v error -show_entries stream=r_frame_rate -of csv=p=0 "$tmpd/v8.mp4" 2>&1)
if [ "$got" = "16/1" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: default fps reads back as '$got', not 16/1"; fi
expect 2 "makes videos: write .mp4" "${wgen[@]}" -o "$tmpd/v.png"
expect 1 "multiples of 16" generate --model "$data/wan/a" --prompt x --width 40 --height 32 --frames 5 --steps 1 -o "$tmpd/x.mp4"
expect 0 "2 ranks ran exactly the decided steps" "${wgen[@]}" --parallel tp=2,sp -o "$tmpd/tpsp.mp4"
expect 2 "both place the two CFG branches" "${wgen[@]}" --negative-prompt x --cfg-batch --parallel cfg=2 -o "$tmpd/x.mp4"
expect 0 "" "${wgen[@]}" --negative-prompt x --cfg-batch -o "$tmpd/batched.mp4"
expect 1 "batched CFG is not supported for FluxPipeline" "${gen[@]}" --true-cfg 2 --negative-prompt x --cfg-batch -o "$tmpd/x.png"
out=$(DIFFLET_CACHE="$tmpd/wcache" "$bin" compile --model "$data/wan/a" --size 48x32 --frames 9 --max-sequence-length 16 --probe 2>/dev/null)
if [[ "$out" == *"probe "* && "$out" == *"transformer "* && "$out" == *"4 compiled"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: compile --probe of Wan: $out"; fi
# Qwen-Image (tests/data/qwenimage/a): true CFG by default when a negative prompt is given
expect 0 "8 transformer calls" generate --model "$data/qwenimage/a" --prompt "a red circle" --negative-prompt "blurry" \
  --width 48 --height 32 --steps 4 --max-sequence-length 64 -o "$tmpd/q.png"
got=$(ffprobe -v error -show_entries stream=codec_name,width,height -of csv=p=0 "$tmpd/q.png" 2>&1)
if [ "$got" = "png,48,32" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: q.png reads back as '$got'"; fi
expect 1 "multiples of 8" generate --model "$data/qwenimage/a" --prompt x --width 44 --height 32 -o "$tmpd/x.png"
expect 1 "max_sequence_length must be in 1..1024" generate --model "$data/qwenimage/a" --prompt x --width 48 --height 32 \
  --max-sequence-length 1025 -o "$tmpd/x.png"
# HunyuanVideo (tests/data/hunyuan/a): an MP4 through generate (ffprobe), 4k + 1 frames,
# CP over the video tokens with the masked text, true CFG on two groups, every step-cache
# mode incl. a calibration with the probe program, compile --probe, refusals
hgen=(generate --model "$data/hunyuan/a" --prompt "a red circle moving" --width 48 --height 32 --frames 9 --steps 3
      --max-sequence-length 48 --seed 3)
expect 0 "3 transformer calls" "${hgen[@]}" -o "$tmpd/h.mp4"
got=$(ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=codec_name,width,height,r_frame_rate,nb_read_frames \
      -of default=nw=1 "$tmpd/h.mp4" 2>&1 | sort | tr '\n' ' ')
want="codec_name=h264 height=32 nb_read_frames=9 r_frame_rate=15/1 width=48 "
if [ "$got" = "$want" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: h.mp4 reads back as '$got', not '$want'"; fi
expect 0 "10 frames requested, 9 made" "${hgen[@]}" --frames 10 -o "$tmpd/h10.mp4"
expect 0 "6 transformer calls" "${hgen[@]}" --true-cfg 2 --negative-prompt "blurry" -o "$tmpd/hcfg.mp4"
expect 0 "3 transformer calls" "${hgen[@]}" --true-cfg 2 -o "$tmpd/hnoneg.mp4" # no negative prompt: no true CFG
expect 1 "batched CFG is not built for HunyuanVideo" "${hgen[@]}" --true-cfg 2 --negative-prompt x --cfg-batch -o "$tmpd/x.mp4"
expect 1 "multiples of 16" generate --model "$data/hunyuan/a" --prompt x --width 40 --height 32 --frames 5 --steps 1 -o "$tmpd/x.mp4"
expect 2 "makes videos: write .mp4" "${hgen[@]}" -o "$tmpd/h.png"
if command -v mpirun >/dev/null; then
    expect 0 "2 ranks ran exactly the decided steps" "${hgen[@]}" --parallel cp=2:ring -o "$tmpd/hcp.mp4"
    expect 0 "2 ranks ran exactly the decided steps" "${hgen[@]}" --parallel tp=2,sp -o "$tmpd/htp.mp4"
    expect 0 "2 ranks ran exactly the decided steps" "${hgen[@]}" --true-cfg 2 --negative-prompt x --parallel cfg=2 -o "$tmpd/hcfg2.mp4"
    expect 2 "not divisible by tp=4" "${hgen[@]}" --parallel tp=4 -o "$tmpd/x.mp4"
    out=$("$bin" profile measure --model "$data/hunyuan/a" --sizes 48x32 --steps 2 --max-dop 2 --name hv --db "$tmpd/hv.db" 2>/dev/null)
    if [[ "$out" == *"stored as 'hv'"* && "$out" == *"DoP 2"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: profile measure of HunyuanVideo: $out"; fi
fi
expect 0 "3 cached steps" "${hgen[@]}" --steps 8 --cache cadence:2 --cache-keep 1,1 -o "$tmpd/hc1.mp4"
expect 0 "cached steps" "${hgen[@]}" --steps 8 --cache online-delta --cache-keep 1,1 -o "$tmpd/hc2.mp4"
printf 'a red circle\na blue square moving\na cat walks\n' > "$tmpd/hprompts.txt"
expect 0 "" calibrate --prompts "$tmpd/hprompts.txt" --model "$data/hunyuan/a" --steps 8 --degree 2 --size 48x32 -o "$tmpd/hcal.json"
expect 0 "cached steps" "${hgen[@]}" --steps 8 --cache "calibrated:$tmpd/hcal.json:0.3" --cache-keep 1,1 -o "$tmpd/hc3.mp4"
out=$(DIFFLET_CACHE="$tmpd/hcache" "$bin" compile --model "$data/hunyuan/a" --size 48x32 --frames 9 --max-sequence-length 48 --probe 2>/dev/null)
if [[ "$out" == *"probe "* && "$out" == *"transformer "* && "$out" == *"5 compiled"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: compile --probe of HunyuanVideo: $out"; fi
# OpenSora 1.2 (tests/data/opensora/a): an MP4 through generate (ffprobe: the 8-pixel-floored
# size, 24 fps), CFG against the null caption (two calls a step, one batched), a negative prompt
# refused, dynamic sequence parallelism / TP / CFG groups, step caching, compile --probe
ogen=(generate --model "$data/opensora/a" --prompt "a red fox runs through the snow" --width 60 --height 40 --frames 34
      --steps 2 --seed 3)
expect 0 "4 transformer calls" "${ogen[@]}" -o "$tmpd/o.mp4"
got=$(ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=codec_name,width,height,r_frame_rate,nb_read_frames \
      -of default=nw=1 "$tmpd/o.mp4" 2>&1 | sort | tr '\n' ' ')
want="codec_name=h264 height=40 nb_read_frames=34 r_frame_rate=24/1 width=56 "
if [ "$got" = "$want" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: o.mp4 reads back as '$got', not '$want'"; fi
# the same frames whatever the thread count (the VAE's convolutions once split sums by thread)
OMP_NUM_THREADS=1 "$bin" "${ogen[@]}" --save-frames "$tmpd/of1" -o "$tmpd/of1.mp4" >/dev/null 2>&1
OMP_NUM_THREADS=2 "$bin" "${ogen[@]}" --save-frames "$tmpd/of2" -o "$tmpd/of2.mp4" >/dev/null 2>&1
if [ -n "$(ls "$tmpd/of1" 2>/dev/null)" ] && diff -r -q "$tmpd/of1" "$tmpd/of2" >/dev/null; then pass=$((pass+1));
else fail=$((fail+1)); echo "FAIL: OpenSora frames at 1 and 2 threads differ (or were not written)"; fi
expect 0 "2 transformer calls" "${ogen[@]}" --guidance 1 -o "$tmpd/o1.mp4"
expect 0 "4 transformer calls" "${ogen[@]}" --cfg-batch -o "$tmpd/ob.mp4"
expect 1 "null caption" "${ogen[@]}" --negative-prompt "blurry" -o "$tmpd/x.mp4"
expect 2 "makes videos: write .mp4" "${ogen[@]}" -o "$tmpd/o.png"
if command -v mpirun >/dev/null; then
    expect 0 "2 ranks ran exactly the decided steps" "${ogen[@]}" --parallel cp=2 -o "$tmpd/ocp.mp4"
    expect 0 "2 ranks ran exactly the decided steps" "${ogen[@]}" --parallel tp=2 -o "$tmpd/otp.mp4"
    expect 0 "2 ranks ran exactly the decided steps" "${ogen[@]}" --parallel cfg=2 -o "$tmpd/ocfg.mp4"
    expect 2 "sequence parallelism" "${ogen[@]}" --parallel tp=2,sp -o "$tmpd/x.mp4"
    expect 2 "tp=3 does not divide" "${ogen[@]}" --parallel tp=3 -o "$tmpd/x.mp4"
fi
expect 0 "cached steps" "${ogen[@]}" --steps 6 --cache cadence:2 --cache-keep 1,1 -o "$tmpd/oc.mp4"
out=$(DIFFLET_CACHE="$tmpd/ocache" "$bin" compile --model "$data/opensora/a" --size 60x40 --frames 34 --probe 2>/dev/null)
if [[ "$out" == *"probe "* && "$out" == *"transformer "* && "$out" == *"4 compiled"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: compile --probe of OpenSora: $out"; fi
# LTX-2 (tests/data/ltx2/pipe): video with sound: an MP4 with an H.264 and a stereo AAC stream (ffprobe), the
# WAV (stereo float: the vocoder's two channels, not a mono mix)
lgen=(generate --model "$data/ltx2/pipe" --prompt "a red ball bounces" --negative-prompt "blurry" --width 96 --height 96
      --frames 9 --steps 2 --seed 1)
expect 0 "8 transformer calls" "${lgen[@]}" -o "$tmpd/l.mp4" --save-audio "$tmpd/l.wav"
got=$(ffprobe -v error -show_entries stream=codec_type,codec_name,width,height,sample_rate,channels -of csv=p=0 "$tmpd/l.mp4" 2>&1 | tr '\n' ' ')
if [[ "$got" == *"h264,video,96,96"* && "$got" == *"aac,audio,24000,2"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: l.mp4 streams (want aac,audio,24000,2): '$got'"; fi
got=$(ffprobe -v error -show_entries stream=codec_name,sample_rate,channels -of csv=p=0 "$tmpd/l.wav" 2>&1 | tr '\n' ' ')
if [[ "$got" == *"pcm_f32le,24000,2"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: --save-audio's WAV for LTX-2 (want pcm_f32le,24000,2): '$got'"; fi
expect 1 "multiples of" generate --model "$data/ltx2/pipe" --prompt x --width 80 --height 96 --frames 9 --steps 1 -o "$tmpd/x.mp4"
# LTX-2's own step loop caches each guidance pass (2 steps x 4 passes here); a calibration with its probe program
expect 0 "8 cached steps" "${lgen[@]}" --steps 6 --cache cadence:2 --cache-keep 1,1 -o "$tmpd/lc1.mp4"
expect 0 "cached steps" "${lgen[@]}" --steps 6 --cache online-delta --cache-keep 1,1 -o "$tmpd/lc2.mp4"
printf 'a red ball\na blue square moving\na cat walks\n' > "$tmpd/lprompts.txt"
expect 0 "" calibrate --prompts "$tmpd/lprompts.txt" --model "$data/ltx2/pipe" --steps 8 --degree 2 --size 96x96 -o "$tmpd/lcal.json"
expect 0 "cached steps" "${lgen[@]}" --steps 8 --cache "calibrated:$tmpd/lcal.json:0.3" --cache-keep 1,1 -o "$tmpd/lc3.mp4"
out=$(DIFFLET_CACHE="$tmpd/lcache" "$bin" compile --model "$data/ltx2/pipe" --size 96x96 --frames 9 --max-sequence-length 16 --probe 2>/dev/null)
if [[ "$out" == *"probe "* && "$out" == *"transformer "* && "$out" == *"7 compiled"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: compile --probe of LTX-2: $out"; fi
# LTX-2 --parallel: refused layouts (before anything is launched) and real self-launched jobs
expect 2 "not divisible by tp=4" "${lgen[@]}" --parallel tp=4 -o "$tmpd/x.mp4"
expect 2 "sequence parallelism" "${lgen[@]}" --parallel tp=2,sp -o "$tmpd/x.mp4"
expect 2 "tp x cp = 4" "${lgen[@]}" --parallel tp=2,cp=2:ulysses -o "$tmpd/x.mp4"
# cfg=2 needs two passes a step: LTX-2's audio CFG (7), STG and modality guidance act at --guidance 1 too
# (counted from the folder before launching); a folder with every guidance term off makes one pass
lno="$tmpd/ltx-noguide"; mkdir -p "$lno"
for c in "$data/ltx2/pipe"/*; do [ "$(basename "$c")" = difflet.json ] || ln -s "$(readlink -f "$c")" "$lno/$(basename "$c")"; done
cat > "$lno/difflet.json" <<'JSON'
{"defaults": {"width": 96, "height": 96, "num_frames": 9, "fps": 24.0, "max_sequence_length": 16,
  "audio_guidance_scale": 1, "stg_scale": 0, "audio_stg_scale": 0, "modality_scale": 1, "audio_modality_scale": 1}}
JSON
expect 2 "this request makes 1 pass per step" generate --model "$lno" --prompt x --guidance 1 --steps 1 --parallel cfg=2 -o "$tmpd/x.mp4"
expect 1 "batched CFG is not built for LTX-2" "${lgen[@]}" --cfg-batch -o "$tmpd/x.mp4"
if command -v mpirun >/dev/null; then
    expect 0 "2 ranks ran exactly the decided steps" "${lgen[@]}" --parallel cp=2:ring -o "$tmpd/lp1.mp4"
    expect 0 "8 cached steps" "${lgen[@]}" --steps 6 --cache cadence:2 --cache-keep 1,1 --parallel tp=2 -o "$tmpd/lp2.mp4"
    # cfg=2: each group runs whole passes (cond + STG / uncond + modality): one rank's bytes
    "$bin" "${lgen[@]}" --threads 1 --save-frames "$tmpd/l1f" --save-audio "$tmpd/l1.wav" -o "$tmpd/l1.mp4" >/dev/null 2>&1
    expect 0 "2 ranks ran exactly the decided steps" "${lgen[@]}" --threads 1 --parallel cfg=2 --save-frames "$tmpd/l2f" \
      --save-audio "$tmpd/l2.wav" -o "$tmpd/l2.mp4"
    if [ -s "$tmpd/l1.wav" ] && diff -rq "$tmpd/l1f" "$tmpd/l2f" >/dev/null && cmp -s "$tmpd/l1.wav" "$tmpd/l2.wav"; then pass=$((pass+1));
    else fail=$((fail+1)); echo "FAIL: LTX-2 cfg=2 frames / waveform differ from one rank's"; fi
    expect 0 "2 ranks ran exactly the decided steps" "${lgen[@]}" --guidance 1 --parallel cfg=2 -o "$tmpd/lp3.mp4"
    expect 0 "" compile --model "$data/ltx2/pipe" --size 96x96 --frames 9 --max-sequence-length 16 --parallel tp=2
fi
# a FLUX folder whose transformer is a GGUF file (Q8_0, Black Forest Labs' names) instead of safetensors
gg="$tmpd/flux-gguf"; mkdir -p "$gg/transformer"
for c in model_index.json scheduler text_encoder text_encoder_2 tokenizer tokenizer_2 vae; do ln -s "$(readlink -f "$flux/$c")" "$gg/$c"; done
ln -s "$flux/transformer/config.json" "$gg/transformer/config.json"
ln -s "$data/flux/gguf/flux-tiny-Q8_0.gguf" "$gg/transformer/flux1-tiny-Q8_0.gguf"
expect 0 "2 transformer calls" generate --model "$gg" --prompt "a red cube" --width 48 --height 32 --steps 2 \
  --max-sequence-length 32 -o "$tmpd/gguf.png"
# ... compiled into an int8 program: the GGUF blocks dequantized, requantized per channel
expect 0 "2 transformer calls" generate --model "$gg" --prompt "a red cube" --width 48 --height 32 --steps 2 \
  --max-sequence-length 32 --dtype int8 -o "$tmpd/gguf8.png"
expect 2 "int8 or int8-wo" generate --model "$gg" --prompt "a red cube" --dtype int4 -o "$tmpd/x.png"
out=$("$bin" inspect "$gg" 2>&1)
if [[ "$out" == *"flux1-tiny-Q8_0.gguf: 112 tensors"* && "$out" == *"Q8_0"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: inspect of a GGUF folder: $out"; fi
ln -s "$data/flux/gguf/flux-tiny-Q4_0.gguf" "$gg/transformer/second.gguf"
expect 1 "2 .gguf files" generate --model "$gg" --prompt x --width 48 --height 32 --steps 1 --max-sequence-length 32 -o "$tmpd/x.png"
# int8 activation calibration (calibrate-int8): W8A8's activation error measured per linear on prompts, written
# into the model folder, read by every int8 compile of it (its hash in the key). At threshold 0 every linear it saw
# compiles weight-only: the int8 picture is int8-wo's, byte for byte; at 1 none does: int8's without a calibration
cf="$tmpd/flux-cal"; mkdir -p "$cf"
for c in model_index.json scheduler text_encoder text_encoder_2 tokenizer tokenizer_2 transformer vae; do ln -s "$(readlink -f "$flux/$c")" "$cf/$c"; done
printf "a red circle\n# a comment\na blue square on a green background\n" > "$tmpd/cal.txt"
: > "$tmpd/nocal.txt"
cg=(generate --model "$cf" --prompt "a red cube" --width 48 --height 32 --steps 2 --max-sequence-length 32)
expect 0 "" "${cg[@]}" --dtype int8 -o "$tmpd/i8.png"
expect 0 "" "${cg[@]}" --dtype int8-wo -o "$tmpd/wo.png"
expect 0 "2 prompts" calibrate-int8 --model "$cf" --prompts "$tmpd/cal.txt" --steps 2 --size 48x32 --threshold 0
got=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); c=j["components"]
print(sorted(c), all(v["scheme"] == "int8-wo" and v["act_error"] > 0 and v["tokens"] > 0 for l in c.values() for v in l.values()))' "$cf/int8_calibration.json" 2>&1)
if [[ "$got" == *"'text_encoder', 'text_encoder_2', 'transformer'"*"True" ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: int8_calibration.json: $got"; fi
expect 0 "" "${cg[@]}" --dtype int8 -o "$tmpd/i8c0.png"
if cmp -s "$tmpd/i8c0.png" "$tmpd/wo.png" && ! cmp -s "$tmpd/i8.png" "$tmpd/wo.png"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: int8 at calibration threshold 0 is not int8-wo's picture"; fi
expect 0 "" calibrate-int8 --model "$cf" --prompts "$tmpd/cal.txt" --steps 2 --size 48x32 --threshold 1
expect 0 "" "${cg[@]}" --dtype int8 -o "$tmpd/i8c1.png"
if cmp -s "$tmpd/i8c1.png" "$tmpd/i8.png"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: int8 at calibration threshold 1 is not int8's picture"; fi
echo '{"threshold": 0.05}' > "$cf/int8_calibration.json"
expect 1 "components" "${cg[@]}" --dtype int8 -o "$tmpd/x.png"
expect 0 "" "${cg[@]}" --dtype int8-wo -o "$tmpd/x.png"
expect 2 "--threshold" calibrate-int8 --model "$cf" --prompts "$tmpd/cal.txt" --threshold 2
expect 2 "required" calibrate-int8 --model "$cf"
expect 1 "no prompts" calibrate-int8 --model "$cf" --prompts "$tmpd/nocal.txt"
# a Hub repository id, resolved offline in a Hugging Face cache laid out as the hub
# library lays it out (refs/main -> commit, snapshots/<commit>/ linking to blobs/)
hub="$tmpd/hf/hub"; repo="$hub/models--test-org--flux-dev"; commit=0123456789abcdef0123456789abcdef01234567
mkdir -p "$repo/blobs" "$repo/refs" "$repo/snapshots/$commit"
(cd "$flux" && find -L . -type f) | while read -r f; do
    b=$(sha256sum "$flux/$f" | cut -c1-64); cp "$flux/$f" "$repo/blobs/$b"
    mkdir -p "$(dirname "$repo/snapshots/$commit/$f")"; ln -sf "$repo/blobs/$b" "$repo/snapshots/$commit/$f"
done
printf '%s' "$commit" > "$repo/refs/main"
"$bin" "${gen[@]}" -o "$tmpd/direct.png" >/dev/null 2>&1
for ref in test-org/flux-dev "test-org/flux-dev@main" "test-org/flux-dev@$commit"; do
    g2=("${gen[@]}"); g2[2]=$ref
    HF_HUB_CACHE="$hub" expect 0 "" "${g2[@]}" -o "$tmpd/hub.png"
    if cmp -s "$tmpd/hub.png" "$tmpd/direct.png"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: --model $ref draws another picture"; fi
    rm -f "$tmpd/hub.png"
done
(unset HF_HUB_CACHE; HF_HOME="$tmpd/hf" "$bin" generate --model test-org/flux-dev --prompt x --width 32 --height 48 \
  --steps 1 --max-sequence-length 32 -o "$tmpd/hub2.png" >/dev/null 2>&1)
if [ -s "$tmpd/hub2.png" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: HF_HOME/hub was not searched"; fi
HF_HUB_CACHE="$hub" expect 1 "not in the local Hugging Face cache (looked for $hub/models--test-org--nothing" generate --model test-org/nothing --prompt x
HF_HUB_CACHE="$hub" expect 1 "revision \`v9\` is not in the local cache" generate --model test-org/flux-dev@v9 --prompt x
expect 1 "neither a folder nor a Hub repository id" generate --model 'org/na me' --prompt x
# tokenize: ids and tokens as transformers gives them (expected values from transformers 5 on
# difflet-tiny's two tokenizers)
tiny="$(dirname "$data")/../models/difflet-tiny"
got=$("$bin" tokenize --model "$tiny" --json "A red circle, top-left!" 2>&1)
want='{"ids":[0,263,333,320,268,298,1,304,1,1],"tokens":["<|startoftext|>","a</w>","red</w>","circle</w>",",</w>","top</w>","<|endoftext|>","left</w>","<|endoftext|>","<|endoftext|>"]}'
if [ "$got" = "$want" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: tokenize (CLIP): $got"; fi
got=$("$bin" tokenize --model "$tiny" --component tokenizer_2 --json "A red circle, top-left!" 2>&1)
want='{"ids":[3,2,28,24,9,3,11,17,2,49,7,39,16,2,1],"tokens":["▁","<unk>","▁red","▁circle",",","▁","to","p","<unk>","l","e","f","t","<unk>","</s>"]}'
if [ "$got" = "$want" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: tokenize (T5): $got"; fi
expect 2 "names a folder of the model" tokenize --model "$tiny" --component ../x "a"
expect 1 "does not exist" tokenize --model "$tiny" --component nothing "a"
if "$bin" models | grep -q "^FluxPipeline .*image"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: difflet models does not list FluxPipeline"; fi
# generate --parallel: refused layouts (before anything is built) and a real
# self-launched mpirun job
expect 2 "not divisible by tp=4" generate --model "$flux" --prompt x --parallel tp=4
expect 2 "cfg=2 runs a step's guidance passes" generate --model "$flux" --prompt x --parallel cfg=2
expect 2 "unknown key" generate --model "$flux" --prompt x --parallel pp=2
expect 2 "ulysses, ring or gather" generate --model "$flux" --prompt x --parallel cp=2:spiral
if command -v mpirun >/dev/null; then
    expect 0 "2 ranks ran exactly the decided steps" generate --model "$flux" --prompt "a red circle" --width 32 \
      --height 48 --steps 3 --max-sequence-length 32 --seed 7 --parallel cp=2:ring -o "$tmpd/par.png"
    expect 0 "4 ranks ran exactly the decided steps" generate --model "$flux" --prompt "a red circle" \
      --negative-prompt "blue" --true-cfg 2 --width 32 --height 48 --steps 3 --max-sequence-length 32 \
      --parallel tp=2,sp,cfg=2 -o "$tmpd/par2.png"
    expect 0 "" compile --model "$flux" --size 32x48 --max-sequence-length 32 --parallel tp=2,sp
    expect 2 "not divisible by tp=4" compile --model "$flux" --size 32x48 --parallel tp=4
    "$bin" generate --model "$flux" --prompt "a" --prompt "b" --width 32 --height 48 --steps 2 \
      --max-sequence-length 32 --parallel dp=2 -o "$tmpd/dp.png" >/dev/null 2>&1
    if [ -s "$tmpd/dp-0.png" ] && [ -s "$tmpd/dp-1.png" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: dp=2 did not write dp-0.png and dp-1.png"; fi
fi
expect 0 "" inspect "$data/io/clip_sharded/model.safetensors.index.json"
expect 0 "" --help
# sched: profiles in SQLite, simulate deterministic per seed, honest `measure`
export DIFFLET_PROFILES="$tmpd/profiles.db"
printf 'resolution,phase,dop,seconds\nlow,dit,1,3\nlow,dit,2,1.6\nlow,vae,1,0.2\nhigh,dit,1,20\nhigh,dit,2,10.5\nhigh,dit,4,6\nhigh,vae,1,1\n' > "$tmpd/p.csv"
expect 0 "" profile import "$tmpd/p.csv" --name mine
expect 0 "" profile show mine
expect 1 "no profile named" profile show nosuch
printf 'low,dit,3,1\n' > "$tmpd/bad.csv"
expect 1 "" profile import "$tmpd/bad.csv" --name bad
if command -v mpirun >/dev/null; then # measured on this machine: DoP 1 and 2, each an mpirun job
    expect 0 "" profile measure --model "$flux" --sizes 32x48 --steps 3 --reps 1 --max-dop 2 --name meas
    out=$("$bin" profile show meas 2>&1)
    if [[ "$out" == *"(3 steps"* ]] && [[ "$out" == *"32x48"* ]] && [ "$(echo "$out" | grep -c ' dit ')" = 1 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: measured profile: $out"; fi
    out=$("$bin" simulate --profile meas --rate 0.5 --requests 50 2>&1)
    if [[ "$out" == *"p99"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: simulate on the measured profile: $out"; fi
fi
expect 2 "is not WxH" profile measure --model "$flux" --sizes 32by48
expect 2 "bad argument" simulate --policy nonsense
expect 2 "bad argument" simulate --mix 1:x
a=$("$bin" simulate --profile mine --policy ddit --rate 0.3 --mix 1:1 --requests 300 --seed 9 2>&1)
b=$("$bin" simulate --profile mine --policy ddit --rate 0.3 --mix 1:1 --requests 300 --seed 9 2>&1)
c=$("$bin" simulate --profile mine --policy ddit --rate 0.3 --mix 1:1 --requests 300 --seed 10 2>&1)
if [ "$a" = "$b" ] && [ "$a" != "$c" ] && [[ "$a" == *"p99"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: simulate determinism: $a / $b / $c"; fi
expect 0 "" simulate --policy optimal --nodes 2 --rate burst --requests 100
# DDiT on real ranks (OpenSora a, resumable): a burst of 4 at two sizes on 2 units + the scheduler rank;
# every request's frames are the bytes of the same requests run at a static DoP 1 (no promotion, no
# group); the promotion itself is tested step by step in test_parallel (1 -> W -> 1 ranks)
printf 'resolution,phase,dop,seconds\n40p,dit,1,0.04\n40p,dit,2,0.03\n40p,vae,1,0.2\n80p,dit,1,0.2\n80p,dit,2,0.1\n80p,vae,1,0.8\n' > "$tmpd/dd.csv"
expect 0 "" profile import "$tmpd/dd.csv" --name dd
dd=(ddit --model "$data/opensora/a" --sizes 56x40,112x80 --frames 34 --profile dd --steps 12 --requests 4 --mix 1:1)
expect 2 "power of two" "${dd[@]}" --units 3
expect 2 "but profile 'mine' has 2 resolutions" ddit --model "$data/opensora/a" --sizes 56x40 --frames 34 --profile mine
expect 2 "cannot move a request between rank groups" ddit --model "$data/wan/a" --sizes 48x32 --frames 9 --profile dd
if command -v mpirun >/dev/null; then
    out=$("$bin" "${dd[@]}" --units 2 --out "$tmpd/dd1" --json "$tmpd/dd1.json" 2>&1)
    if [[ "$out" == *"completed 4  failed 0"* && "$out" == *"simulated / real"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: ddit run: $out"; fi
    out=$("$bin" "${dd[@]}" --units 2 --policy sdop:1 --out "$tmpd/dd0" 2>&1)
    # PSNR >= 50 dB per request against DoP 1 (identical where the layout allows)
    got=$(python3 "$(dirname "$(readlink -f "$0")")/rgb_psnr.py" "$tmpd/dd1" "$tmpd/dd0" 4)
    if [ "$got" = identical ] || awk -v p="$got" 'BEGIN { exit !(p >= 50) }'; then pass=$((pass+1));
    else fail=$((fail+1)); echo "FAIL: ddit outputs against static DoP 1's: worst PSNR $got (want >= 50): $out"; fi
    # the VAE decoupled: two 80p requests (B = 2) at once; the second starts on the unit the first's DiT
    # frees while its leader decodes (DoP 1), and without decoupling waits for both (DoP 2)
    dec=(ddit --model "$data/opensora/a" --sizes 56x40,112x80 --frames 34 --profile dd --steps 12 --requests 2 --mix 0:1 --units 2)
    a=$("$bin" "${dec[@]}" 2>&1 | grep "request   1 "); b=$("$bin" "${dec[@]}" --no-decouple 2>&1 | grep "request   1 ")
    if [[ "$a" == *"DoP 1 ->"* && "$b" == *"DoP 2 -> 2"* ]]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: decoupled VAE: '$a' / '$b'"; fi
fi
out=$("$bin" version) && [[ "$out" == difflet* ]] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: version output: $out"; }
echo "test_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]

#!/usr/bin/env bash
# Install the stack the Bridge engine runs on -- Megatron-Bridge 0.6.2, Megatron-Core 0.19.2, Transformer Engine
# 2.20.2 and what they import -- from a folder of wheels into TARGET, without network, on a GPU machine that already
# has torch (2.11 + CUDA 13 checked), numpy and triton. Transformer Engine's torch extension ships as an sdist only: it
# is compiled here against this machine's torch (about 2 minutes on 16 cores).
#
#   bench/tools/install_bridge_stack.sh WHEELS [TARGET=/tmp/site]     then: export PYTHONPATH=TARGET
#
# WHEELS holds the wheels of tests/requirements-bridge.txt's stack plus megatron-bridge, megatron-core,
# transformer-engine(-cu13) and transformer_engine_torch-*.tar.gz (or the wheel an earlier build left in WHEELS,
# which skips the build). A wheel too large to move in one piece may come as
# parts `<name>.part0..N` with `<name>.sha256` (made with `split -n N -d -a 1 WHEEL <name>.part`); they are joined and
# checked first.
set -euo pipefail
WHEELS=${1:?usage: install_bridge_stack.sh WHEELS [TARGET]}
TARGET=${2:-/tmp/site}
PY=${PYTHON:-python3}

shopt -s nullglob
for sum in "$WHEELS"/*.sha256; do
  stem=${sum%.sha256}
  parts=("$stem".part?)
  [ ${#parts[@]} -gt 0 ] || continue
  joined=$(mktemp -p "$WHEELS")
  cat "${parts[@]}" > "$joined"
  [ "$(sha256sum "$joined" | cut -d' ' -f1)" = "$(cat "$sum")" ] || { echo "checksum mismatch joining $stem.part*" >&2; exit 1; }
  name=$("$PY" - "$joined" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    info = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
    dist = info.split("/")[0].removesuffix(".dist-info")
    tags = [l.split(": ", 1)[1].strip() for l in z.read(info).decode().splitlines() if l.startswith("Tag: ")]
print(f"{dist}-{tags[0]}.whl")
PYEOF
)
  mv "$joined" "$WHEELS/$name"
  echo "joined ${#parts[@]} parts into $name"
done

# One pip call: wheels sharing a top-level package (megatron/, transformer_engine/) are merged into TARGET.
wheels=()
for w in "$WHEELS"/*.whl; do [[ ${w##*/} == transformer_engine_torch-* ]] || wheels+=("$w"); done
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$TARGET" "${wheels[@]}"

built=("$WHEELS"/transformer_engine_torch-*.whl)
sdist=("$WHEELS"/transformer_engine_torch-*.tar.gz)
if [ ${#built[@]} -eq 1 ]; then  # built on an earlier machine of the same torch and GPU architecture
  "$PY" -m zipfile -e "${built[0]}" "$TARGET"
  echo "unpacked the built Transformer Engine torch extension ${built[0]##*/}"
elif [ ${#sdist[@]} -eq 1 ]; then
  build=$(mktemp -d)
  tar xzf "${sdist[0]}" -C "$build"
  nvidia=$("$PY" -c "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0] + '/'))")
  arch=$("$PY" -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'{m}{n}')")
  t0=$(date +%s)
  (cd "$build"/transformer_engine_torch-* && PYTHONPATH="$TARGET" CPATH="$nvidia/cudnn/include:$nvidia/nccl/include" \
     NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS="$arch" MAX_JOBS=$(nproc) \
     "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$build/out" .)
  echo "built the Transformer Engine torch extension for sm_$arch in $(( $(date +%s) - t0 )) s"
  # pip --target would skip it (transformer_engine/ exists): unpack it into the merged tree; keep the wheel in
  # WHEELS, so the next machine can skip the build.
  "$PY" -m zipfile -e "$build"/out/transformer_engine_torch-*.whl "$TARGET"
  cp "$build"/out/transformer_engine_torch-*.whl "$WHEELS"/
fi
# Bridge's initialize_megatron runs `make` in megatron/core/datasets; the wheel ships the compiled helper only.
[ -f "$TARGET/megatron/core/datasets/Makefile" ] || printf 'all:\n\t@true\n' > "$TARGET/megatron/core/datasets/Makefile"
PYTHONPATH="$TARGET" "$PY" -c "import transformer_engine.pytorch, megatron.bridge.training.pretrain; print('Transformer Engine + Megatron-Bridge import')"

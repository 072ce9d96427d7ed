#!/usr/bin/env bash
# After ../shared/gpu/prepare.sh, from the project's root: the releases this checkout is tested with that
# the GPU machine lacks (it has transformers 5.17; model.padding_free needs 5.25), as Python 3.12 wheels
# into .whl/, which the kit's check.sh installs there. Versions: the ones installed here (the venv that ran
# the suite); their own dependencies are the GPU machine's. docs/development/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
packages=()
for name in transformers huggingface_hub tokenizers safetensors hf-xet kernels; do
    version=$("$python" -c "import importlib.metadata as m; print(m.version('$name'))")
    packages+=("$name==$version")
done
mkdir -p .whl
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${packages[@]}"
echo "into .whl/: ${packages[*]}"

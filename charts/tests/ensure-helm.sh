#!/usr/bin/env bash
# Prints the path of a helm binary built from source through the Go module proxy, building it
# once into $HOME/.cache/tandem/helm/<version>/ (later runs only check that it is there).
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
bin_dir="${HOME}/.cache/tandem/helm/${HELM_VERSION}"
if [[ ! -x "${bin_dir}/helm" ]]; then
  mkdir -p "${bin_dir}"
  echo "building helm ${HELM_VERSION} into ${bin_dir} (once)" >&2
  GOFLAGS=-mod=mod GOBIN="${bin_dir}" CGO_ENABLED=0 go install "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2
fi
echo "${bin_dir}/helm"

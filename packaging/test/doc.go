// Package test holds the packaging tests that need libraries the agent must
// not depend on, in a module of its own so that they stay out of the
// agent's module graph:
//
//   - the Helm chart (packaging/helm/mig-agent) is rendered with Helm's own
//     Go packages (helm.sh/helm/v4: chart loader, values schema, template
//     engine, linter): lint, golden renders under testdata (go test -run
//     TestGolden -update rewrites them), the default render equals the
//     plain manifests of packaging/kubernetes, bad values are refused with a
//     clear message. The golden renders are what e2e/packaging_kube_test.go
//     creates on a real API server. The render with the chart's
//     values-gpu-operator.yaml has the GPU Operator's mounts, gate,
//     RuntimeClass and deploy-label nodeSelector; the render with
//     values-dra.yaml the DRA driver's node affinity and driver root.
//   - packaging/kubernetes-gpu-operator and packaging/kubernetes-dra are
//     built with kustomize's own Go packages (sigs.k8s.io/kustomize/api, as
//     `kubectl apply -k`) and checked against the chart's GPU Operator and
//     DRA renders.
//   - packaging/Dockerfile is parsed with BuildKit's Dockerfile parser
//     (github.com/moby/buildkit) and checked; there is no Docker daemon in
//     the test environment to build it.
package test

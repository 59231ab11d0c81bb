// Package test renders the mig-agent Helm chart (packaging/helm/mig-agent)
// with Helm's own Go packages (helm.sh/helm/v4: chart loader, values schema,
// template engine, linter), in a module of its own so that Helm stays out of
// the agent's module graph.
//
// The tests lint the chart, compare its renders with golden files under
// testdata (go test -run TestGolden -update rewrites them), check that the
// default render equals the plain manifests of packaging/kubernetes, and
// that bad values are refused with a clear message. The golden renders are
// what e2e/packaging_kube_test.go creates on a real API server.
package test

// Package monitoring holds no code: it is the test of mig-agent's Grafana
// dashboard and Prometheus alert rules in this folder, kept in its own Go
// module so that github.com/prometheus/prometheus (for the PromQL parser and
// the rules-file format) stays out of the agent's module graph.
//
// Run it here: cd packaging/monitoring && go test ./...
package monitoring

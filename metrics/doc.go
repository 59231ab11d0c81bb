// Package metrics is mig-agent's Prometheus instrumentation (docs/reference.md#metrics-and-health)
// and the small HTTP server that serves it with the health endpoints.
//
// Every metric lives on a private registry owned by a *Metrics value; the
// package has no globals. The agent pushes what it knows (state, configs,
// GPUs, outcomes) through setter methods; a scrape reads a consistent
// snapshot. Series that describe something that is gone (an old desired
// config, a GPU or profile that vanished) are removed, not left at a stale
// value.
//
// A part of the agent that fails to collect what a metric needs (NVML, the
// API server, PodResources) reports it with SetCollectorError and logs one
// line itself; this package never panics on bad input and never stops the
// process.
package metrics

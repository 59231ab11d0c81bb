package geometry

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkValidatePlan8GPU: validate and plan all-balanced for an 8-GPU
// node of each model whose GPUs hold the all-1g geometry (one op = node).
func BenchmarkValidatePlan8GPU(b *testing.B) {
	for _, m := range migModels() {
		b.Run(m.Key, func(b *testing.B) {
			gpus := node(b, m.Key, 8)
			spec := Generate(gpus)
			one := spec.Names[3] // all-<the first 1-slice profile>
			reqs, _, err := spec.Resolve(one, gpus)
			if err != nil {
				b.Fatal(err)
			}
			for i := range gpus {
				in, err := Fit(&gpus[i].Catalogue, reqs[i].Devices)
				if err != nil {
					b.Fatal(err)
				}
				gpus[i].ModeCurrent, gpus[i].ModePending, gpus[i].Instances = true, true, in
			}
			b.ReportAllocs()
			for b.Loop() {
				reqs, _, err := spec.Resolve("all-balanced", gpus)
				if err != nil {
					b.Fatal(err)
				}
				for i, r := range reqs {
					if err := Validate(gpus[i], r); err != nil {
						b.Fatal(err)
					}
				}
				p, err := BuildPlan(spec, "all-balanced", gpus)
				if err != nil || p.GPUs[0].Action != ActionChange {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRandomRequests: validate and plan a corpus of random requests
// (fitting or not) against GPUs of every model holding random geometries
// (one op = one request).
func BenchmarkRandomRequests(b *testing.B) {
	type job struct {
		gpu GPU
		req Request
	}
	var jobs []job
	r := rand.New(rand.NewPCG(42, 42))
	for _, m := range migModels() {
		for range 200 {
			g := gpuOf(m, 0)
			if in, err := Fit(&g.Catalogue, randomRequest(r, &g.Catalogue)); err == nil {
				g.ModeCurrent, g.ModePending, g.Instances = true, true, in
			}
			jobs = append(jobs, job{g, Request{MigEnabled: true, Devices: randomRequest(r, &g.Catalogue)}})
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		j := &jobs[i%len(jobs)]
		if Validate(j.gpu, j.req) == nil {
			if _, err := PlanGPU(j.gpu, &j.req); err != nil {
				b.Fatal(err)
			}
		}
		i++
	}
}

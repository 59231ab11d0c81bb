package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/record"
)

func TestServer(t *testing.T) {
	var readyErr, liveErr error
	m := newMetrics("v", "go", false)
	m.SetState(record.StateSuccess)
	srv := NewServer("127.0.0.1:0", m, func() error { return readyErr }, func() error { return liveErr })
	ts := httptest.NewServer(srv.Handler)
	defer ts.Close()

	tests := []struct {
		name     string
		method   string
		path     string
		notReady error
		notLive  error
		code     int
		body     string // exact, or a substring when contains is set
		contains bool
	}{
		{name: "healthz", method: "GET", path: "/healthz", code: 200, body: "ok"},
		{name: "healthz while not ready", method: "GET", path: "/healthz", notReady: errors.New("x"), code: 200, body: "ok"},
		{name: "healthz not live", method: "GET", path: "/healthz", notLive: errors.New("NVML has been unavailable for 5m0s"), code: 503, body: "NVML has been unavailable for 5m0s"},
		{name: "readyz ready", method: "GET", path: "/readyz", code: 200, body: "ok"},
		{name: "readyz not ready", method: "GET", path: "/readyz",
			notReady: errors.New("NVML unavailable: driver not loaded"), code: 503, body: "NVML unavailable: driver not loaded"},
		{name: "metrics", method: "GET", path: "/metrics", code: 200,
			body: `migagent_state{state="success"} 1`, contains: true},
		{name: "head healthz", method: "HEAD", path: "/healthz", code: 200},
		{name: "post not allowed", method: "POST", path: "/metrics", code: 405, body: "Method Not Allowed", contains: true},
		{name: "unknown path", method: "GET", path: "/nope", code: 404, body: "404", contains: true},
		{name: "index", method: "GET", path: "/", code: 200, body: "/readyz", contains: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			readyErr, liveErr = tt.notReady, tt.notLive
			req, err := http.NewRequest(tt.method, ts.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body := readAll(t, resp.Body)
			if resp.StatusCode != tt.code {
				t.Errorf("%s %s: code %d, want %d (%q)", tt.method, tt.path, resp.StatusCode, tt.code, body)
			}
			if tt.contains && !strings.Contains(body, tt.body) || !tt.contains && body != tt.body {
				t.Errorf("%s %s: body %q, want %q", tt.method, tt.path, body, tt.body)
			}
		})
	}
}

func TestServerNilReady(t *testing.T) {
	srv := NewServer(":0", newMetrics("v", "go", false), nil, nil)
	rec := httptest.NewRecorder()
	srv.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 200 || rec.Body.String() != "ok" {
		t.Errorf("nil ready: %d %q", rec.Code, rec.Body)
	}
	if srv.ReadHeaderTimeout == 0 {
		t.Error("no ReadHeaderTimeout")
	}
}

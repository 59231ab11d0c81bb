package metrics

import (
	"io"
	"net/http"
	"time"
)

// Server timeouts: a scrape or a probe is small; a slow client must not hold
// a connection for long.
const (
	readHeaderTimeout = 5 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 60 * time.Second
)

// NewServer returns the HTTP server of --metrics-address (not started):
//
//   - /metrics: the metrics of m;
//   - /healthz: 200 "ok" while the process serves HTTP and live returns
//     nil, else 503 with the error's text (liveness: the kubelet restarts
//     the container). A nil live is always live;
//   - /readyz: 200 "ok" when ready returns nil, else 503 with the error's
//     text (readiness). A nil ready is always ready.
//
// The caller runs ListenAndServe and Shutdown.
func NewServer(addr string, m *Metrics, ready, live func() error) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if live != nil {
			if err := live(); err != nil {
				writeText(w, http.StatusServiceUnavailable, err.Error())
				return
			}
		}
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				writeText(w, http.StatusServiceUnavailable, err.Error())
				return
			}
		}
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "mig-agent\n/metrics\n/healthz\n/readyz\n")
	})
	return &http.Server{
		Addr:              addr,
		Handler:           mux,
		ReadHeaderTimeout: readHeaderTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
	}
}

func writeText(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

package nvmlx

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
)

// ErrBadBackend: --nvml names no backend.
var ErrBadBackend = errors.New("invalid NVML backend")

// Options select and configure a backend (--nvml, --nvml-library,
// --sim-state, --sim-faults, --sim-no-reset).
type Options struct {
	// Backend is "real" or "sim:SPEC" ("sim:h200x8").
	Backend string
	// Library is the NVML library to load (--nvml-library); empty for the
	// default libnvidia-ml.so.1.
	Library string
	// Sim configures the simulator.
	Sim nvmlsim.Options
	// Logger receives the backend's logs; nil discards them.
	Logger *slog.Logger
	// Idle opens the backend without an NVML session (the daemon): NVML is
	// initialized for each call or Begin…End pass and shut down after it,
	// and a missing driver is found at the first call, not by Open.
	Idle bool
}

// Open opens the backend o names.
func Open(o Options) (GPU, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.Backend == "real":
		return NewReal(o)
	case strings.HasPrefix(o.Backend, "sim:"):
		s, err := newSimWith(strings.TrimPrefix(o.Backend, "sim:"), o.Sim, o.Logger, o.Idle)
		if err != nil {
			return nil, err
		}
		o.Logger.Info("simulated GPUs opened", "spec", strings.TrimPrefix(o.Backend, "sim:"),
			"state", o.Sim.StatePath, "faults", o.Sim.Faults, "noReset", o.Sim.NoReset)
		return s, nil
	}
	return nil, fmt.Errorf("%w %q: want \"real\" or \"sim:SPEC\" (for example sim:h200x8)", ErrBadBackend, o.Backend)
}

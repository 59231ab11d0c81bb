package profiles

// MIG strategies of NVIDIA's device plugin and GPU Feature Discovery, as the
// node label nvidia.com/mig.strategy declares them: "none" (MIG ignored),
// "single" (one resource type for the whole node, nvidia.com/gpu) and
// "mixed" (one resource per profile, nvidia.com/mig-<profile>).
const (
	StrategyNone   = "none"
	StrategySingle = "single"
	StrategyMixed  = "mixed"
)

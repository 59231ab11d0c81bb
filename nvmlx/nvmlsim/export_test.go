package nvmlsim

// ParseFaults and State are for the external tests (package nvmlsim_test).
var ParseFaults = parseFaults

type State = simState

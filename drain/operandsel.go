package drain

import "github.com/migagent/mig-agent/drain/operandsel"

// The operands the agent restarts after a change or waits for while it
// pauses them, by the names --operand-selector takes (operandsel).
const (
	OperandDevicePlugin = operandsel.OperandDevicePlugin
	OperandGFD          = operandsel.OperandGFD
	OperandValidator    = operandsel.OperandValidator
	OperandDRAPlugin    = operandsel.OperandDRAPlugin
	OperandDCGMExporter = operandsel.OperandDCGMExporter
	OperandDCGM         = operandsel.OperandDCGM
)

// Selectors tell which pod of the node is which operand (operandsel).
type Selectors = operandsel.Selectors

var (
	// OperandNames, DefaultOperandSelectors, DefaultOperandNamespaces:
	// operandsel's.
	OperandNames             = operandsel.OperandNames
	DefaultOperandSelectors  = operandsel.DefaultOperandSelectors
	DefaultOperandNamespaces = operandsel.DefaultOperandNamespaces
	// parseSelectors is operandsel.ParseSelectors (a test counts the calls).
	parseSelectors = operandsel.ParseSelectors
)

// ParseSelectors parses --operand-selector and --plugin-selector
// (operandsel.ParseSelectors).
func ParseSelectors(operand, extra []string) (*Selectors, error) {
	return parseSelectors(operand, extra)
}

// OperandNamespaces is --operand-namespace resolved (operandsel).
func OperandNamespaces(given []string, own string) []string {
	return operandsel.OperandNamespaces(given, own)
}

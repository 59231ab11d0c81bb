package gpus

// PartialError is for the external tests (package gpus_test).
type PartialError = partialError

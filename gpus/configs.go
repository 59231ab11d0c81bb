package gpus

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/migagent/mig-agent/geometry"
)

// ConfigFile is a parsed config file with where it came from.
type ConfigFile struct {
	Path   string
	SHA256 string
	Spec   *geometry.Spec
}

// ConfigSourceGenerated is a record's configSource for a config generated
// from discovery (not from the config file).
const ConfigSourceGenerated = "generated"

// LoadConfigFile reads and strictly parses a config file. An empty path
// gives nil: only generated configs are known then.
func LoadConfigFile(path string) (*ConfigFile, error) {
	if path == "" {
		return nil, nil
	}
	data, err := ReadUserFile(path, geometry.MaxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	spec, err := geometry.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	sum := sha256.Sum256(data)
	return &ConfigFile{Path: path, SHA256: hex.EncodeToString(sum[:]), Spec: spec}, nil
}

// Source is the configSource string of records for configs of this file.
func (c *ConfigFile) Source() string { return c.Path + "@sha256:" + c.SHA256 }

// Lookup finds a named config: first in the config file, then in the
// configs generated from the node's GPUs. It returns the spec holding it
// and the configSource to record.
func Lookup(file *ConfigFile, name string, gpus []geometry.GPU) (*geometry.Spec, string, error) {
	if file != nil {
		if _, ok := file.Spec.Configs[name]; ok {
			return file.Spec, file.Source(), nil
		}
	}
	gen := geometry.Generate(gpus)
	if _, ok := gen.Configs[name]; ok {
		return gen, ConfigSourceGenerated, nil
	}
	var known []string
	if file != nil {
		known = append(known, file.Spec.Names...)
	}
	known = append(known, gen.Names...)
	sort.Strings(known)
	known = dedupe(known)
	where := "the generated configs"
	if file != nil {
		where = file.Path + " or the generated configs"
	}
	return nil, "", fmt.Errorf("%w: %q is not in %s (known: %s)", geometry.ErrUnknownConfig, name, where, strings.Join(known, ", "))
}

// dedupe drops adjacent duplicates from sorted s, in place.
func dedupe(s []string) []string {
	out := s[:0]
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

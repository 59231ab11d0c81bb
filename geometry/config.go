package geometry

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/migagent/mig-agent/profiles"
)

// Limits of the config parser.
const (
	// MaxConfigBytes is the largest config file Parse accepts.
	MaxConfigBytes = 1 << 20
	// MaxCount is the largest count of one profile in mig-devices (real
	// GPUs offer at most 7 of anything).
	MaxCount = 64
	// maxNodes bounds the YAML nodes Parse visits, aliases expanded, so an
	// alias bomb fails fast instead of eating memory.
	maxNodes = 100_000
	// maxMergeDepth bounds nested "<<" merge keys.
	maxMergeDepth = 8
	// maxDeviceIndex bounds the GPU indices of devices lists.
	maxDeviceIndex = 1 << 16
)

// ConfigVersion is the only config version mig-agent reads (nvidia-mig-parted v1).
const ConfigVersion = "v1"

// Spec is a parsed config file: named MIG configs, each a list of entries.
type Spec struct {
	Version string
	// Names lists the config names in file order.
	Names   []string
	Configs map[string][]Entry
}

// Entry is one item of a named config: which GPUs it selects and what it
// asks of them.
type Entry struct {
	// DeviceFilter lists PCI device ids normalized to upper-case hex
	// ("0x233510DE"), optionally qualified with a PCI subsystem id
	// ("0x233510DE:0x18BF10DE") as nvidia-mig-parted allows. Empty: every GPU.
	DeviceFilter []string
	Devices      DeviceSelector
	MigEnabled   bool
	// MigDevices are the profile counts in file order. Each counted device
	// is one GPU instance; see Fit.
	MigDevices []DeviceCount
}

// DeviceSelector is the devices field: "all" or a list of GPU indices.
type DeviceSelector struct {
	All     bool
	Indices []int
}

// ErrInvalidConfig is wrapped by every error Parse returns.
var ErrInvalidConfig = errors.New("invalid MIG config")

// Parse reads a config file in nvidia-mig-parted's v1 format, strictly:
// unknown or repeated keys, wrong types, bad profile names or device ids,
// negative or absurd counts are errors that name the line, the config and
// the entry. Every file nvidia-mig-parted accepts is accepted, with the
// same meaning (YAML anchors, aliases and merge keys included, and YAML 1.1
// booleans such as "yes" for mig-enabled), with three exceptions that
// protect the user: unparseable device-filter ids, duplicate GPU indices
// and counts over MaxCount.
func Parse(data []byte) (*Spec, error) {
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrInvalidConfig, MaxConfigBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty document", ErrInvalidConfig)
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one YAML document", ErrInvalidConfig)
	}
	p := &parser{}
	return p.spec(&doc)
}

type parser struct{ nodes int }

type pair struct{ k, v *yaml.Node }

func (p *parser) errf(n *yaml.Node, ctx, format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s%s", ErrInvalidConfig, n.Line, ctx, fmt.Sprintf(format, args...))
}

// deref counts a visited node and follows an alias to its anchor.
func (p *parser) deref(n *yaml.Node) (*yaml.Node, error) {
	if p.nodes++; p.nodes > maxNodes {
		return nil, fmt.Errorf("%w: more than %d YAML nodes (aliases expanded)", ErrInvalidConfig, maxNodes)
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil || n.Alias.Kind == yaml.AliasNode {
			return nil, p.errf(n, "", "bad alias")
		}
		return n.Alias, nil
	}
	return n, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "a document"
}

// pairs returns the key/value pairs of a mapping, merge keys resolved
// (explicit keys win, then earlier merge sources); a repeated key is an error.
func (p *parser) pairs(n *yaml.Node, ctx, what string, depth int) ([]pair, error) {
	n, err := p.deref(n)
	if err != nil {
		return nil, err
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.errf(n, ctx, "%s must be a mapping, not %s", what, kindName(n))
	}
	var own, merged []pair
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := p.deref(n.Content[i])
		if err != nil {
			return nil, err
		}
		if k.Kind != yaml.ScalarNode {
			return nil, p.errf(k, ctx, "a key in %s is %s, not a string", what, kindName(k))
		}
		if k.Tag == "!!merge" {
			if depth >= maxMergeDepth {
				return nil, p.errf(k, ctx, "merge keys nested deeper than %d", maxMergeDepth)
			}
			src, err := p.deref(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			srcs := []*yaml.Node{src}
			if src.Kind == yaml.SequenceNode {
				srcs = src.Content
			}
			for _, s := range srcs {
				ps, err := p.pairs(s, ctx, "a merge source", depth+1)
				if err != nil {
					return nil, err
				}
				merged = append(merged, ps...)
			}
			continue
		}
		if line, dup := seen[k.Value]; dup {
			return nil, p.errf(k, ctx, "key %q repeated in %s (first at line %d)", k.Value, what, line)
		}
		seen[k.Value] = k.Line
		own = append(own, pair{k, n.Content[i+1]})
	}
	for _, m := range merged {
		if _, dup := seen[m.k.Value]; !dup {
			seen[m.k.Value] = m.k.Line
			own = append(own, m)
		}
	}
	return own, nil
}

func (p *parser) spec(doc *yaml.Node) (*Spec, error) {
	root := doc
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) != 1 {
			return nil, fmt.Errorf("%w: empty document", ErrInvalidConfig)
		}
		root = doc.Content[0]
	}
	top, err := p.pairs(root, "", "the document", 0)
	if err != nil {
		return nil, err
	}
	s := &Spec{Configs: map[string][]Entry{}}
	var configs *yaml.Node
	for _, kv := range top {
		switch kv.k.Value {
		case "version":
			v, err := p.deref(kv.v)
			if err != nil {
				return nil, err
			}
			if v.Kind != yaml.ScalarNode || v.Value != ConfigVersion {
				return nil, p.errf(v, "", "version is %s; only %q is supported", kindName(v), ConfigVersion)
			}
			s.Version = v.Value
		case "mig-configs":
			configs = kv.v
		default:
			return nil, p.errf(kv.k, "", "unknown key %q (want version, mig-configs)", kv.k.Value)
		}
	}
	if s.Version == "" {
		return nil, p.errf(root, "", "missing version (want version: %s)", ConfigVersion)
	}
	if configs == nil {
		return nil, p.errf(root, "", "missing mig-configs")
	}
	named, err := p.pairs(configs, "", "mig-configs", 0)
	if err != nil {
		return nil, err
	}
	if len(named) == 0 {
		return nil, p.errf(configs, "", "mig-configs has no config")
	}
	for _, kv := range named {
		name := kv.k.Value
		if strings.TrimSpace(name) == "" {
			return nil, p.errf(kv.k, "", "empty config name")
		}
		entries, err := p.entries(kv.v, fmt.Sprintf("config %q: ", name))
		if err != nil {
			return nil, err
		}
		s.Names = append(s.Names, name)
		s.Configs[name] = entries
	}
	return s, nil
}

func (p *parser) entries(n *yaml.Node, ctx string) ([]Entry, error) {
	n, err := p.deref(n)
	if err != nil {
		return nil, err
	}
	if n.Kind != yaml.SequenceNode {
		return nil, p.errf(n, ctx, "must be a list of entries, not %s", kindName(n))
	}
	if len(n.Content) == 0 {
		return nil, p.errf(n, ctx, "has no entry")
	}
	out := make([]Entry, 0, len(n.Content))
	for i, item := range n.Content {
		e, err := p.entry(item, fmt.Sprintf("%sentry %d: ", ctx, i+1))
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func (p *parser) entry(n *yaml.Node, ctx string) (Entry, error) {
	var e Entry
	kvs, err := p.pairs(n, ctx, "an entry", 0)
	if err != nil {
		return e, err
	}
	var haveDevices, haveEnabled, haveMigDevices bool
	for _, kv := range kvs {
		v, err := p.deref(kv.v)
		if err != nil {
			return e, err
		}
		switch kv.k.Value {
		case "device-filter":
			e.DeviceFilter, err = p.deviceFilter(v, ctx)
		case "devices":
			haveDevices = true
			e.Devices, err = p.devices(v, ctx)
		case "mig-enabled":
			haveEnabled = true
			e.MigEnabled, err = p.boolean(v, ctx, "mig-enabled")
		case "mig-devices":
			// An empty mig-devices is kept as nil: "{}" and absent mean the same.
			if haveMigDevices = v.Tag != "!!null"; haveMigDevices {
				e.MigDevices, err = p.migDevices(v, ctx)
			}
		default:
			err = p.errf(kv.k, ctx, "unknown key %q (want device-filter, devices, mig-enabled, mig-devices)", kv.k.Value)
		}
		if err != nil {
			return e, err
		}
	}
	switch {
	case !haveDevices:
		return e, p.errf(n, ctx, "missing devices (all, or a list of GPU indices)")
	case !haveEnabled:
		return e, p.errf(n, ctx, "missing mig-enabled (true or false)")
	case e.MigEnabled && !haveMigDevices:
		return e, p.errf(n, ctx, "mig-enabled is true but mig-devices is missing (write mig-devices: {} for none)")
	case !e.MigEnabled && len(e.MigDevices) > 0:
		return e, p.errf(n, ctx, "mig-devices listed while mig-enabled is false")
	}
	return e, nil
}

// yaml11Bool reads the plain scalars YAML 1.1 (and so nvidia-mig-parted,
// through sigs.k8s.io/yaml) reads as booleans; YAML 1.2 has only true/false.
func yaml11Bool(s string) (value, ok bool) {
	switch s {
	case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE":
		return true, true
	case "n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE":
		return false, true
	}
	return false, false
}

func (p *parser) boolean(n *yaml.Node, ctx, key string) (bool, error) {
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!bool" || n.Style == 0 && n.Tag == "!!str") {
		if b, ok := yaml11Bool(n.Value); ok {
			return b, nil
		}
	}
	return false, p.errf(n, ctx, "%s is %s, not true or false", key, kindName(n))
}

func (p *parser) deviceFilter(n *yaml.Node, ctx string) ([]string, error) {
	items := []*yaml.Node{n}
	switch {
	case n.Kind == yaml.SequenceNode:
		items = n.Content
	case n.Kind != yaml.ScalarNode:
		return nil, p.errf(n, ctx, "device-filter must be a PCI device id or a list of them, not %s", kindName(n))
	case n.Tag == "!!null" || n.Value == "":
		return nil, nil // nvidia-mig-parted: an empty filter matches every GPU
	}
	var out []string
	for _, it := range items {
		it, err := p.deref(it)
		if err != nil {
			return nil, err
		}
		if it.Kind != yaml.ScalarNode {
			return nil, p.errf(it, ctx, "device-filter item is %s, not a PCI device id", kindName(it))
		}
		id, err := normalizeDeviceID(it.Value)
		if err != nil {
			return nil, p.errf(it, ctx, "device-filter: %v", err)
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out, nil
}

// normalizeDeviceID reads a PCI device id as nvidia-mig-parted does
// ("0x233510DE", optionally ":0x<subsystem>") and prints it in upper-case hex.
func normalizeDeviceID(s string) (string, error) {
	main, sub, hasSub := strings.Cut(strings.TrimSpace(s), ":")
	v, err := strconv.ParseUint(main, 0, 32)
	if err != nil {
		return "", fmt.Errorf("%q is not a PCI device id like \"0x233510DE\"", s)
	}
	out := fmt.Sprintf("0x%08X", v)
	if hasSub {
		w, err := strconv.ParseUint(sub, 0, 32)
		if err != nil {
			return "", fmt.Errorf("%q has a bad subsystem id (want \"0x233510DE:0x18BF10DE\")", s)
		}
		out += fmt.Sprintf(":0x%08X", w)
	}
	return out, nil
}

func (p *parser) devices(n *yaml.Node, ctx string) (DeviceSelector, error) {
	if n.Kind == yaml.ScalarNode && n.Value == "all" && n.Tag == "!!str" {
		return DeviceSelector{All: true}, nil
	}
	if n.Kind != yaml.SequenceNode {
		return DeviceSelector{}, p.errf(n, ctx, "devices is %s; want all or a list of GPU indices", kindName(n))
	}
	sel := DeviceSelector{Indices: []int{}}
	for _, it := range n.Content {
		it, err := p.deref(it)
		if err != nil {
			return sel, err
		}
		v, err := strconv.ParseInt(it.Value, 0, 64)
		if it.Kind != yaml.ScalarNode || it.Tag != "!!int" || err != nil || v < 0 || v >= maxDeviceIndex {
			return sel, p.errf(it, ctx, "devices item is %s, not a GPU index (0, 1, ...)", kindName(it))
		}
		if slices.Contains(sel.Indices, int(v)) {
			return sel, p.errf(it, ctx, "GPU index %d listed twice in devices", v)
		}
		sel.Indices = append(sel.Indices, int(v))
	}
	return sel, nil
}

func (p *parser) migDevices(n *yaml.Node, ctx string) ([]DeviceCount, error) {
	kvs, err := p.pairs(n, ctx, "mig-devices", 0)
	if err != nil {
		return nil, err
	}
	var out []DeviceCount
	var names []profiles.Name
	for _, kv := range kvs {
		name, err := profiles.Parse(kv.k.Value)
		if err != nil {
			return nil, p.errf(kv.k, ctx, "mig-devices: %v", err)
		}
		for i, prev := range names {
			if prev.Equal(name) {
				return nil, p.errf(kv.k, ctx, "mig-devices: %q and %q are the same profile", out[i].Profile, kv.k.Value)
			}
		}
		v, err := p.deref(kv.v)
		if err != nil {
			return nil, err
		}
		c, err := strconv.ParseInt(v.Value, 0, 64)
		if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || err != nil {
			return nil, p.errf(v, ctx, "mig-devices: count of %q is %s, not a whole number", kv.k.Value, kindName(v))
		}
		if c < 0 || c > MaxCount {
			return nil, p.errf(v, ctx, "mig-devices: count of %q is %d; want 0 to %d", kv.k.Value, c, MaxCount)
		}
		names = append(names, name)
		out = append(out, DeviceCount{Profile: kv.k.Value, Count: int(c)})
	}
	return out, nil
}

// Marshal prints s in nvidia-mig-parted's style (version: v1, mig-configs,
// configs in Names order, then any others sorted). The result parses back
// to an equal Spec; Marshal checks that and fails rather than write a file
// Parse would reject.
func (s *Spec) Marshal() ([]byte, error) {
	names := slices.Clone(s.Names)
	var rest []string
	for n := range s.Configs {
		if !slices.Contains(names, n) {
			rest = append(rest, n)
		}
	}
	sort.Strings(rest)
	names = append(names, rest...)

	configs := &yaml.Node{Kind: yaml.MappingNode}
	for i, name := range names {
		entries, ok := s.Configs[name]
		if !ok || slices.Contains(names[:i], name) {
			return nil, fmt.Errorf("marshal: config %q listed twice or has no entries", name)
		}
		key := str(name)
		if needsQuotes(name) {
			key.Style = yaml.DoubleQuotedStyle
		}
		seq := &yaml.Node{Kind: yaml.SequenceNode}
		for _, e := range entries {
			seq.Content = append(seq.Content, e.node())
		}
		configs.Content = append(configs.Content, key, seq)
	}
	root := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		str("version"), str(ConfigVersion), str("mig-configs"), configs,
	}}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	if _, err := Parse(b.Bytes()); err != nil {
		return nil, fmt.Errorf("marshal: the result would not parse: %w", err)
	}
	return b.Bytes(), nil
}

func (e *Entry) node() *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	add := func(k string, v *yaml.Node) { n.Content = append(n.Content, str(k), v) }
	flow := func() *yaml.Node { return &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle} }
	if len(e.DeviceFilter) > 0 {
		f := flow()
		for _, id := range e.DeviceFilter {
			q := str(id)
			q.Style = yaml.DoubleQuotedStyle
			f.Content = append(f.Content, q)
		}
		add("device-filter", f)
	}
	if e.Devices.All {
		add("devices", str("all"))
	} else {
		d := flow()
		for _, i := range e.Devices.Indices {
			d.Content = append(d.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(i)})
		}
		add("devices", d)
	}
	add("mig-enabled", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(e.MigEnabled)})
	if e.MigEnabled || len(e.MigDevices) > 0 {
		m := &yaml.Node{Kind: yaml.MappingNode}
		if len(e.MigDevices) == 0 {
			m.Style = yaml.FlowStyle
		}
		for _, d := range e.MigDevices {
			k := str(d.Profile)
			k.Style = yaml.DoubleQuotedStyle
			m.Content = append(m.Content, k, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(d.Count)})
		}
		add("mig-devices", m)
	}
	return n
}

func str(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }

// needsQuotes reports whether a plain scalar would read as something other
// than a string to a YAML 1.1 reader such as nvidia-mig-parted.
func needsQuotes(s string) bool {
	if _, ok := yaml11Bool(s); ok {
		return true
	}
	switch s {
	case "", "~", "null", "Null", "NULL", "<<":
		return true
	}
	if _, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64); err == nil {
		return true
	}
	_, err := strconv.ParseInt(s, 0, 64)
	return err == nil || strings.ContainsAny(s[:1], "0123456789+-.")
}

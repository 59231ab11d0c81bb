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
	maxDeviceIndex = 1023
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
// protect the user: unparseable device-filter ids, repeated GPU indices
// and counts over MaxCount.
func Parse(data []byte) (s *Spec, err error) {
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrInvalidConfig, MaxConfigBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc, extra yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) || err == nil && len(doc.Content) == 0 {
		return nil, fmt.Errorf("%w: empty document", ErrInvalidConfig)
	} else if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one YAML document", ErrInvalidConfig)
	}
	// The parser stops at the first error by panicking with a parseError,
	// recovered here (as encoding/json does); other panics go on.
	defer func() {
		if r := recover(); r != nil {
			pe, ok := r.(parseError)
			if !ok {
				panic(r)
			}
			s, err = nil, pe.error
		}
	}()
	p := &parser{}
	return p.spec(doc.Content[0]), nil
}

type parseError struct{ error }

type parser struct{ nodes int }

type pair struct{ k, v *yaml.Node }

func (p *parser) fail(n *yaml.Node, ctx, format string, args ...any) {
	panic(parseError{fmt.Errorf("%w: line %d: %s%s", ErrInvalidConfig, n.Line, ctx, fmt.Sprintf(format, args...))})
}

// deref counts a visited node and follows an alias to its anchor.
func (p *parser) deref(n *yaml.Node) *yaml.Node {
	if p.nodes++; p.nodes > maxNodes {
		panic(parseError{fmt.Errorf("%w: more than %d YAML nodes (aliases expanded)", ErrInvalidConfig, maxNodes)})
	}
	if n.Kind == yaml.AliasNode {
		if n = n.Alias; n == nil || n.Kind == yaml.AliasNode {
			panic(parseError{fmt.Errorf("%w: bad alias", ErrInvalidConfig)})
		}
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode && len(n.Content) == 0:
		return "an empty list"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Tag == "!!null":
		return "nothing"
	}
	return fmt.Sprintf("%q", n.Value)
}

// pairs returns the key/value pairs of a mapping, merge keys resolved
// (explicit keys win, then earlier merge sources); a repeated key fails.
func (p *parser) pairs(n *yaml.Node, ctx, what string, depth int) []pair {
	if n = p.deref(n); n.Kind != yaml.MappingNode {
		p.fail(n, ctx, "%s must be a mapping, not %s", what, kindName(n))
	}
	var own, merged []pair
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := p.deref(n.Content[i])
		switch {
		case k.Kind != yaml.ScalarNode:
			p.fail(k, ctx, "a key in %s is %s, not a string", what, kindName(k))
		case k.Tag == "!!merge":
			if depth >= maxMergeDepth {
				p.fail(k, ctx, "merge keys nested deeper than %d", maxMergeDepth)
			}
			srcs := []*yaml.Node{p.deref(n.Content[i+1])}
			if srcs[0].Kind == yaml.SequenceNode {
				srcs = srcs[0].Content
			}
			for _, src := range srcs {
				merged = append(merged, p.pairs(src, ctx, "a merge source", depth+1)...)
			}
			continue
		}
		if line, dup := seen[k.Value]; dup {
			p.fail(k, ctx, "key %q repeated in %s (first at line %d)", k.Value, what, line)
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
	return own
}

func (p *parser) spec(root *yaml.Node) *Spec {
	s := &Spec{Configs: map[string][]Entry{}}
	var configs *yaml.Node
	for _, kv := range p.pairs(root, "", "the document", 0) {
		switch kv.k.Value {
		case "version":
			if v := p.deref(kv.v); v.Kind != yaml.ScalarNode || v.Value != ConfigVersion {
				p.fail(v, "", "version is %s; only %q is supported", kindName(v), ConfigVersion)
			}
			s.Version = ConfigVersion
		case "mig-configs":
			configs = kv.v
		default:
			p.fail(kv.k, "", "unknown key %q (want version, mig-configs)", kv.k.Value)
		}
	}
	switch {
	case s.Version == "":
		p.fail(root, "", "missing version (want version: %s)", ConfigVersion)
	case configs == nil:
		p.fail(root, "", "missing mig-configs")
	}
	named := p.pairs(configs, "", "mig-configs", 0)
	if len(named) == 0 {
		p.fail(configs, "", "mig-configs has no config")
	}
	for _, kv := range named {
		name := kv.k.Value
		if strings.TrimSpace(name) == "" {
			p.fail(kv.k, "", "empty config name")
		}
		ctx := fmt.Sprintf("config %q: ", name)
		list := p.deref(kv.v)
		if list.Kind != yaml.SequenceNode || len(list.Content) == 0 {
			p.fail(list, ctx, "must be a list of entries, not %s", kindName(list))
		}
		for i, item := range list.Content {
			s.Configs[name] = append(s.Configs[name], p.entry(item, fmt.Sprintf("%sentry %d: ", ctx, i+1)))
		}
		s.Names = append(s.Names, name)
	}
	return s
}

func (p *parser) entry(n *yaml.Node, ctx string) Entry {
	var e Entry
	var haveDevices, haveEnabled, haveMigDevices bool
	for _, kv := range p.pairs(n, ctx, "an entry", 0) {
		v := p.deref(kv.v)
		switch kv.k.Value {
		case "device-filter":
			e.DeviceFilter = p.deviceFilter(v, ctx)
		case "devices":
			haveDevices, e.Devices = true, p.devices(v, ctx)
		case "mig-enabled":
			haveEnabled, e.MigEnabled = true, p.boolean(v, ctx, "mig-enabled")
		case "mig-devices":
			// An empty mig-devices is kept as nil: "{}" and absent mean the same.
			if haveMigDevices = v.Tag != "!!null"; haveMigDevices {
				e.MigDevices = p.migDevices(v, ctx)
			}
		default:
			p.fail(kv.k, ctx, "unknown key %q (want device-filter, devices, mig-enabled, mig-devices)", kv.k.Value)
		}
	}
	switch {
	case !haveDevices:
		p.fail(n, ctx, "missing devices (all, or a list of GPU indices)")
	case !haveEnabled:
		p.fail(n, ctx, "missing mig-enabled (true or false)")
	case e.MigEnabled && !haveMigDevices:
		p.fail(n, ctx, "mig-enabled is true but mig-devices is missing (write mig-devices: {} for none)")
	case !e.MigEnabled && len(e.MigDevices) > 0:
		p.fail(n, ctx, "mig-devices listed while mig-enabled is false")
	}
	return e
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

func (p *parser) boolean(n *yaml.Node, ctx, key string) bool {
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!bool" || n.Style == 0 && n.Tag == "!!str") {
		if b, ok := yaml11Bool(n.Value); ok {
			return b
		}
	}
	p.fail(n, ctx, "%s is %s, not true or false", key, kindName(n))
	return false
}

func (p *parser) deviceFilter(n *yaml.Node, ctx string) []string {
	items := []*yaml.Node{n}
	switch {
	case n.Kind == yaml.SequenceNode:
		items = n.Content
	case n.Kind != yaml.ScalarNode:
		p.fail(n, ctx, "device-filter must be a PCI device id or a list of them, not %s", kindName(n))
	case n.Tag == "!!null" || n.Value == "":
		return nil // nvidia-mig-parted: an empty filter matches every GPU
	}
	var out []string
	for _, it := range items {
		if it = p.deref(it); it.Kind != yaml.ScalarNode {
			p.fail(it, ctx, "device-filter item is %s, not a PCI device id", kindName(it))
		}
		id, err := normalizeDeviceID(it.Value)
		if err != nil {
			p.fail(it, ctx, "device-filter: %v", err)
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
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

func (p *parser) devices(n *yaml.Node, ctx string) DeviceSelector {
	if n.Kind == yaml.ScalarNode && n.Value == "all" && n.Tag == "!!str" {
		return DeviceSelector{All: true}
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, ctx, "devices is %s; want all or a list of GPU indices", kindName(n))
	}
	sel := DeviceSelector{Indices: []int{}}
	for _, it := range n.Content {
		it = p.deref(it)
		v, err := strconv.ParseInt(it.Value, 0, 64)
		if it.Kind != yaml.ScalarNode || it.Tag != "!!int" || err != nil || v < 0 || v > maxDeviceIndex {
			p.fail(it, ctx, "devices item is %s, not a GPU index (0 to %d)", kindName(it), maxDeviceIndex)
		}
		if slices.Contains(sel.Indices, int(v)) {
			p.fail(it, ctx, "GPU index %d listed twice in devices", v)
		}
		sel.Indices = append(sel.Indices, int(v))
	}
	return sel
}

func (p *parser) migDevices(n *yaml.Node, ctx string) []DeviceCount {
	var out []DeviceCount
	seen := map[string]string{} // canonical name → as written
	for _, kv := range p.pairs(n, ctx, "mig-devices", 0) {
		if _, err := profiles.Parse(kv.k.Value); err != nil {
			p.fail(kv.k, ctx, "mig-devices: %v", err)
		}
		if prev, dup := seen[canonical(kv.k.Value)]; dup {
			p.fail(kv.k, ctx, "mig-devices: %q and %q are the same profile", prev, kv.k.Value)
		}
		seen[canonical(kv.k.Value)] = kv.k.Value
		v := p.deref(kv.v)
		c, err := strconv.ParseInt(v.Value, 0, 64)
		if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || err != nil {
			p.fail(v, ctx, "mig-devices: count of %q is %s, not a whole number", kv.k.Value, kindName(v))
		}
		if c < 0 || c > MaxCount {
			p.fail(v, ctx, "mig-devices: count of %q is %d; want 0 to %d", kv.k.Value, c, MaxCount)
		}
		out = append(out, DeviceCount{Profile: kv.k.Value, Count: int(c)})
	}
	return out
}

// Marshal prints s in nvidia-mig-parted's style (version: v1, mig-configs,
// configs in Names order, then any others sorted). The result parses back
// to an equal Spec; Marshal checks that and fails rather than write a file
// Parse would reject.
func (s *Spec) Marshal() ([]byte, error) {
	names, listed := slices.Clone(s.Names), map[string]bool{}
	for _, n := range names {
		if _, ok := s.Configs[n]; !ok || listed[n] {
			return nil, fmt.Errorf("marshal: config %q listed twice or has no entries", n)
		}
		listed[n] = true
	}
	var rest []string
	for n := range s.Configs {
		if !listed[n] {
			rest = append(rest, n)
		}
	}
	sort.Strings(rest)
	configs := &yaml.Node{Kind: yaml.MappingNode}
	for _, name := range append(names, rest...) {
		key := str(name)
		if !plainName(name) {
			key.Style = yaml.DoubleQuotedStyle
		}
		seq := &yaml.Node{Kind: yaml.SequenceNode}
		for _, e := range s.Configs[name] {
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

// plainName reports whether a config name can be written unquoted and
// still read as a string by a YAML 1.1 reader such as nvidia-mig-parted.
func plainName(s string) bool {
	if _, ok := yaml11Bool(s); ok || s == "" || s == "null" || s == "Null" || s == "NULL" {
		return false
	}
	for i, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && (c >= '0' && c <= '9' || strings.ContainsRune("._-", c))) {
			return false
		}
	}
	return true
}

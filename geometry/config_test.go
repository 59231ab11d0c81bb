package geometry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var fixtures = []string{"config-default.yaml", "config.yaml", "dgx-station-80gb-config.yaml"}

func TestParseNVIDIAFiles(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f, func(t *testing.T) {
			s := readSpec(t, f)
			out, err := s.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse(out)
			if err != nil {
				t.Fatalf("marshalled file does not parse: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(s, back) {
				t.Fatalf("round trip differs:\n%s", out)
			}
		})
	}
}

func TestParseNVIDIAContent(t *testing.T) {
	d := readSpec(t, "config-default.yaml")
	if len(d.Names) != 81 || d.Names[0] != "all-disabled" || d.Names[1] != "all-enabled" {
		t.Fatalf("%d names, first %v", len(d.Names), d.Names[:2])
	}
	bal := d.Configs["all-balanced"]
	if len(bal) != 12 {
		t.Fatalf("all-balanced has %d entries", len(bal))
	}
	a30 := bal[10]
	want := Entry{DeviceFilter: []string{"0x20B710DE"}, Devices: DeviceSelector{All: true}, MigEnabled: true,
		MigDevices: []DeviceCount{{"1g.6gb", 2}, {"2g.12gb", 1}}}
	if !reflect.DeepEqual(a30, want) {
		t.Fatalf("A30 entry %+v", a30)
	}
	if f := d.Configs["all-1g.10gb"][1].DeviceFilter; len(f) != 4 || f[0] != "0x20B010DE" {
		t.Fatalf("all-1g.10gb filter %v", f)
	}
	if e := d.Configs["all-disabled"][0]; e.MigEnabled || !e.Devices.All || e.MigDevices != nil {
		t.Fatalf("all-disabled %+v", e)
	}
	if e := d.Configs["all-enabled"][0]; !e.MigEnabled || e.MigDevices != nil {
		t.Fatalf("all-enabled %+v", e)
	}
	c := readSpec(t, "config.yaml").Configs["custom-config"]
	if !reflect.DeepEqual(c[0].Devices, DeviceSelector{Indices: []int{0, 1, 2, 3}}) || c[0].MigEnabled {
		t.Fatalf("custom-config entry 1 %+v", c[0])
	}
	if got := c[4].MigDevices; !reflect.DeepEqual(got, []DeviceCount{{"1g.5gb", 2}, {"2g.10gb", 1}, {"3g.20gb", 1}}) {
		t.Fatalf("file order lost: %v", got)
	}
}

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       Entry
	}{
		{"lower-case filter string", `{version: v1, mig-configs: {a: [{device-filter: "0x233510de", devices: all, mig-enabled: false}]}}`,
			Entry{DeviceFilter: []string{"0x233510DE"}, Devices: DeviceSelector{All: true}}},
		{"unquoted hex filter, duplicates merged", `{version: v1, mig-configs: {a: [{device-filter: [0x233510DE, "0x233510DE"], devices: all, mig-enabled: false}]}}`,
			Entry{DeviceFilter: []string{"0x233510DE"}, Devices: DeviceSelector{All: true}}},
		{"subsystem filter", `{version: v1, mig-configs: {a: [{device-filter: "0x233510DE:0x18bf10de", devices: all, mig-enabled: false}]}}`,
			Entry{DeviceFilter: []string{"0x233510DE:0x18BF10DE"}, Devices: DeviceSelector{All: true}}},
		{"empty filter", `{version: v1, mig-configs: {a: [{device-filter: "", devices: all, mig-enabled: false}]}}`,
			Entry{Devices: DeviceSelector{All: true}}},
		{"yaml 1.1 bool", "version: v1\nmig-configs:\n  a:\n  - devices: [1, 0]\n    mig-enabled: yes\n    mig-devices: {\"1g.18gb\": 0}\n",
			Entry{Devices: DeviceSelector{Indices: []int{1, 0}}, MigEnabled: true, MigDevices: []DeviceCount{{"1g.18gb", 0}}}},
		{"empty device list", `{version: v1, mig-configs: {a: [{devices: [], mig-enabled: false, mig-devices: {}}]}}`,
			Entry{Devices: DeviceSelector{Indices: []int{}}}},
		{"anchors and merge keys", "version: v1\nmig-configs:\n  a:\n  - &base {devices: all, mig-enabled: true, mig-devices: {\"1g.18gb\": 7}}\n  b:\n  - <<: *base\n    mig-devices: {\"3g.71gb\": 2}\n",
			Entry{Devices: DeviceSelector{All: true}, MigEnabled: true, MigDevices: []DeviceCount{{"3g.71gb", 2}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			got := s.Configs[s.Names[len(s.Names)-1]][0]
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v; want %+v", got, tc.want)
			}
			out, err := s.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if back, err := Parse(out); err != nil || !reflect.DeepEqual(back, s) {
				t.Fatalf("round trip: %v\n%s", err, out)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	const head = "version: v1\nmig-configs:\n  a:\n"
	tests := []struct{ name, yaml, want string }{
		{"empty", "", "empty document"},
		{"comment only", "# nothing\n", "empty document"},
		{"not yaml", "version: [v1\n", "yaml:"},
		{"two documents", "version: v1\n---\nversion: v1\n", "more than one YAML document"},
		{"root list", "- a\n", "line 1: the document must be a mapping"},
		{"missing version", "mig-configs: {a: [{devices: all, mig-enabled: false}]}\n", "missing version"},
		{"version v2", "version: v2\nmig-configs: {}\n", `line 1: version is "v2"; only "v1" is supported`},
		{"unknown top key", "version: v1\nmig-config: {}\n", `line 2: unknown key "mig-config" (want version, mig-configs)`},
		{"repeated top key", "version: v1\nversion: v1\n", `line 2: key "version" repeated in the document (first at line 1)`},
		{"missing mig-configs", "version: v1\n", "missing mig-configs"},
		{"no configs", "version: v1\nmig-configs: {}\n", "mig-configs has no config"},
		{"configs a list", "version: v1\nmig-configs: [a]\n", "mig-configs must be a mapping, not a list"},
		{"duplicate config", head + "  - {devices: all, mig-enabled: false}\n  a:\n  - {devices: all, mig-enabled: false}\n", `line 5: key "a" repeated in mig-configs (first at line 3)`},
		{"config not a list", head + "    devices: all\n", `line 4: config "a": must be a list of entries, not a mapping`},
		{"config empty list", "version: v1\nmig-configs:\n  a: []\n", `line 3: config "a": must be a list of entries, not an empty list`},
		{"entry a string", head + "  - all\n", `line 4: config "a": entry 1: an entry must be a mapping, not "all"`},
		{"unknown entry key", head + "  - devices: all\n    mig-enabled: true\n    mig-device: {}\n", `line 6: config "a": entry 1: unknown key "mig-device" (want device-filter, devices, mig-enabled, mig-devices)`},
		{"duplicate entry key", head + "  - devices: all\n    devices: all\n    mig-enabled: false\n", `line 5: config "a": entry 1: key "devices" repeated in an entry (first at line 4)`},
		{"missing devices", head + "  - mig-enabled: false\n", `config "a": entry 1: missing devices`},
		{"missing mig-enabled", head + "  - devices: all\n", `config "a": entry 1: missing mig-enabled`},
		{"devices word", head + "  - devices: some\n    mig-enabled: false\n", `line 4: config "a": entry 1: devices is "some"; want all or a list of GPU indices`},
		{"devices negative", head + "  - devices: [0, -1]\n    mig-enabled: false\n", `devices item is "-1", not a GPU index (0 to 1023)`},
		{"devices absurd", head + "  - devices: [1024]\n    mig-enabled: false\n", `devices item is "1024", not a GPU index`},
		{"devices string item", head + "  - devices: [\"0\"]\n    mig-enabled: false\n", `devices item is "0", not a GPU index`},
		{"devices duplicate", head + "  - devices: [1, 2, 1]\n    mig-enabled: false\n", "GPU index 1 listed twice in devices"},
		{"mig-enabled word", head + "  - devices: all\n    mig-enabled: maybe\n", `mig-enabled is "maybe", not true or false`},
		{"mig-enabled quoted", head + "  - devices: all\n    mig-enabled: \"true\"\n", `mig-enabled is "true", not true or false`},
		{"mig-devices missing", head + "  - devices: all\n    mig-enabled: true\n", "mig-enabled is true but mig-devices is missing"},
		{"mig-devices with mig off", head + "  - devices: all\n    mig-enabled: false\n    mig-devices: {\"1g.18gb\": 1}\n", "mig-devices listed while mig-enabled is false"},
		{"mig-devices a list", head + "  - devices: all\n    mig-enabled: true\n    mig-devices: [1g.18gb]\n", "mig-devices must be a mapping, not a list"},
		{"bad profile name", head + "  - devices: all\n    mig-enabled: true\n    mig-devices: {\"1x.18gb\": 1}\n", `line 6: config "a": entry 1: mig-devices: invalid MIG profile name "1x.18gb"`},
		{"negative count", head + "  - devices: all\n    mig-enabled: true\n    mig-devices: {\"1g.18gb\": -1}\n", `count of "1g.18gb" is -1; want 0 to 64`},
		{"huge count", head + "  - devices: all\n    mig-enabled: true\n    mig-devices: {\"1g.18gb\": 65}\n", `count of "1g.18gb" is 65; want 0 to 64`},
		{"count not a number", head + "  - devices: all\n    mig-enabled: true\n    mig-devices: {\"1g.18gb\": seven}\n", `count of "1g.18gb" is "seven", not a whole number`},
		{"count a float", head + "  - devices: all\n    mig-enabled: true\n    mig-devices: {\"1g.18gb\": 1.5}\n", `count of "1g.18gb" is "1.5", not a whole number`},
		{"same profile twice", head + "  - devices: all\n    mig-enabled: true\n    mig-devices: {\"1g.24gb+me,gfx\": 1, \"1g.24gb+gfx,me\": 1}\n", `"1g.24gb+me,gfx" and "1g.24gb+gfx,me" are the same profile`},
		{"bad filter", head + "  - device-filter: H200\n    devices: all\n    mig-enabled: false\n", `line 4: config "a": entry 1: device-filter: "H200" is not a PCI device id`},
		{"bad subsystem", head + "  - device-filter: [\"0x233510DE:zz\"]\n    devices: all\n    mig-enabled: false\n", "has a bad subsystem id"},
		{"filter a mapping", head + "  - device-filter: {a: 1}\n    devices: all\n    mig-enabled: false\n", "device-filter must be a PCI device id or a list of them, not a mapping"},
		{"merge cycle", "version: v1\nmig-configs:\n  a:\n  - &e\n    <<: *e\n    devices: all\n    mig-enabled: false\n", "merge keys nested deeper than 8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("parsed: %+v", s)
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q; want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParseLimits(t *testing.T) {
	big := strings.Repeat("#", MaxConfigBytes-10) + "\nversion: v1\n"
	if _, err := Parse([]byte(big)); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("1 MiB input: %v", err)
	}
	// Entries that alias a list of aliased entries: 1000 configs × 1000
	// entries expand to a million entries.
	var b strings.Builder
	b.WriteString("version: v1\nmig-configs:\n  c0: &l [")
	for i := range 1000 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("{devices: all, mig-enabled: false}")
	}
	b.WriteString("]\n")
	for i := 1; i < 1000; i++ {
		fmt.Fprintf(&b, "  c%d: *l\n", i)
	}
	// Merge keys fanning out tenfold per level.
	var m strings.Builder
	m.WriteString("version: v1\nmig-configs:\n  a:\n  - &m0 {devices: all, mig-enabled: false}\n")
	for lvl := 1; lvl <= 7; lvl++ {
		fmt.Fprintf(&m, "  - &m%d {<<: [%s]}\n", lvl, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*m%d, ", lvl-1), 10), ", "))
	}
	// Thousands of distinct profiles in one entry: linear, and valid.
	var many strings.Builder
	many.WriteString("version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: true\n    mig-devices:\n")
	for i := 1; i < 9999; i++ {
		fmt.Fprintf(&many, "      \"1g.%dgb\": 1\n      \"1c.2g.%dgb\": 1\n", i, i)
	}
	start := time.Now()
	if s, err := Parse([]byte(many.String())); err != nil || len(s.Configs["a"][0].MigDevices) != 2*9998 {
		t.Fatalf("many profiles: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("many profiles took %v", d)
	}
	for name, doc := range map[string]string{"alias list": b.String(), "merge fan-out": m.String()} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			_, err := Parse([]byte(doc))
			if err == nil || !strings.Contains(err.Error(), "more than 100000 YAML nodes") {
				t.Fatalf("error %v", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("took %v", d)
			}
		})
	}
}

func TestMarshalStyle(t *testing.T) {
	s := &Spec{Version: "v1", Names: []string{"b", "yes", "a"}, Configs: map[string][]Entry{
		"a":   {{Devices: DeviceSelector{All: true}}},
		"yes": {{Devices: DeviceSelector{All: true}}},
		"b": {{DeviceFilter: []string{"0x233510DE"}, Devices: DeviceSelector{Indices: []int{0, 3}}, MigEnabled: true,
			MigDevices: []DeviceCount{{"3g.71gb", 1}, {"1g.18gb", 4}}}},
		"c": {{Devices: DeviceSelector{All: true}, MigEnabled: true}},
	}}
	out, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := `version: v1
mig-configs:
  b:
    - device-filter: ["0x233510DE"]
      devices: [0, 3]
      mig-enabled: true
      mig-devices:
        "3g.71gb": 1
        "1g.18gb": 4
  "yes":
    - devices: all
      mig-enabled: false
  a:
    - devices: all
      mig-enabled: false
  c:
    - devices: all
      mig-enabled: true
      mig-devices: {}
`
	if string(out) != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	bad := &Spec{Version: "v1", Names: []string{"a"}, Configs: map[string][]Entry{"a": {{Devices: DeviceSelector{All: true}, MigEnabled: true, MigDevices: []DeviceCount{{"1g.18gb", 99}}}}}}
	if _, err := bad.Marshal(); err == nil {
		t.Fatal("marshalled a count Parse rejects")
	}
}

func FuzzParse(f *testing.F) {
	for _, file := range fixtures {
		data, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"version: v1\nmig-configs:\n  a:\n  - {devices: [0, 1], mig-enabled: true, mig-devices: {\"1c.3g.71gb\": 2}}\n",
		"version: v1\nmig-configs:\n  a:\n  - &e {devices: all, mig-enabled: false}\n  b: [*e, {<<: *e, devices: [2]}]\n",
		"version: v1\nmig-configs: {\"1\": [{device-filter: 0x20B710DE, devices: all, mig-enabled: on, mig-devices: {}}]}\n",
		"version: v1\nmig-configs: {a: [{device-filter: [\"0x233510DE:0x1\"], devices: all, mig-enabled: false}]}\n",
		"version: v1\nmig-configs:\n  a:\n  - &e\n    <<: *e\n",
		"[[[[", "version: v1\n---\n", "\"\\u0000\": 1",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error without ErrInvalidConfig: %v", err)
			}
			return
		}
		out, err := s.Marshal()
		if err != nil {
			t.Fatalf("parsed but does not marshal: %v", err)
		}
		back, err := Parse(out)
		if err != nil || !reflect.DeepEqual(s, back) {
			t.Fatalf("round trip: %v\n%s", err, out)
		}
	})
}

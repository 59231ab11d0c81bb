package main

import (
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// migPartedEnv maps nvidia-mig-parted's environment variables (the
// Sources of its urfave/cli flags: cmd/nvidia-mig-parted/apply/apply.go,
// assert/assert.go, export/export.go, main.go) to the flag of mig-agent
// that means the same. Each is read where the command has that flag and
// neither the flag nor its MIG_AGENT_* variable is given; a warning names
// the native variable. MIG_PARTED_MODE_ONLY is accepted beside the name
// mig-parted reads, MIG_PARTED_MODE_CHANGE_ONLY.
var migPartedEnv = []struct{ env, flag string }{
	{"MIG_PARTED_CONFIG_FILE", "config-file"},
	{"MIG_PARTED_SELECTED_CONFIG", "selected-config"},
	{"MIG_PARTED_HOOKS_FILE", "hooks-file"},
	{"MIG_PARTED_SKIP_RESET", "skip-reset"},
	{"MIG_PARTED_MODE_CHANGE_ONLY", "mode-only"},
	{"MIG_PARTED_MODE_ONLY", "mode-only"},
	{"MIG_PARTED_OUTPUT_FORMAT", "output"},
	{"MIG_PARTED_CONFIG_LABEL", "config-name"},
}

// migPartedFlagNames reads nvidia-mig-parted's long flag names as the flag
// of mig-agent that means the same (export's --output-format and
// --config-label, export/export.go; the global --debug, main.go).
func migPartedFlagNames(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	switch name {
	case "output-format":
		name = "output"
	case "config-label":
		name = "config-name"
	}
	return pflag.NormalizedName(name)
}

// nativeEnv is the MIG_AGENT_* variable of flag.
func nativeEnv(flag string) string {
	return "MIG_AGENT_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// bindMigPartedEnv binds mig-parted's variables (see migPartedEnv) to v
// at the environment's precedence: below the flag and MIG_AGENT_*, above
// the settings file. MIG_PARTED_DEBUG=true stands for --log-level debug.
func bindMigPartedEnv(v *viper.Viper, cmd *cobra.Command, loud bool) error {
	warn := func(alias, native string) {
		if !loud {
			return
		}
		slog.New(slog.NewTextHandler(os.Stderr, nil)).Warn("nvidia-mig-parted variable read; mig-agent's own is "+native, "variable", alias, "native", native)
	}
	bound := map[string]bool{}
	for _, m := range migPartedEnv {
		f := cmd.Flags().Lookup(m.flag)
		_, set := os.LookupEnv(m.env)
		if f == nil || !set || bound[m.flag] || f.Changed {
			continue
		}
		native := nativeEnv(m.flag)
		if _, ok := os.LookupEnv(native); ok {
			continue
		}
		bound[m.flag] = true
		if err := v.BindEnv(m.flag, m.env); err != nil {
			return err
		}
		warn(m.env, native)
	}
	if f := cmd.Flags().Lookup("log-level"); f != nil && !f.Changed {
		if _, ok := os.LookupEnv(nativeEnv("log-level")); !ok {
			if d := strings.ToLower(os.Getenv("MIG_PARTED_DEBUG")); d == "true" || d == "1" {
				v.SetDefault("log-level", "debug")
				warn("MIG_PARTED_DEBUG", nativeEnv("log-level"))
			}
		}
	}
	return nil
}

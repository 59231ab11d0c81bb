// Command deviceplugin runs testkit/realnode/testplugin as a program, for
// the image realnode.PluginImage: a device plugin the real kubelet's tests
// run as a DaemonSet pod, the way NVIDIA's runs (the kubelet's
// device-plugin directory mounted from the host at the same path).
//
//	deviceplugin RESOURCE DEVICE-ID...
//
// It registers once and exits 0 on SIGTERM.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/migagent/mig-agent/testkit/realnode/testplugin"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: deviceplugin RESOURCE DEVICE-ID...")
		os.Exit(2)
	}
	p := testplugin.New(os.Args[1], os.Args[2:]...)
	stop, err := p.Start(pluginapi.DevicePluginPath, pluginapi.KubeletSocket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer stop()
	fmt.Printf("registered %s with %d devices\n", os.Args[1], len(os.Args)-2)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// Command pause is the program of the images testkit/realnode builds for
// the real kubelet's pods: the pod sandbox image (containerd's sandbox_image,
// what registry.k8s.io/pause is elsewhere: nothing can be pulled here) and
// the test pods' container. It sleeps until SIGTERM or SIGINT and exits 0,
// so a pod it runs ends at once when the kubelet stops it. Built static
// (CGO_ENABLED=0): the image holds this file alone.
//
// It first prints its arguments (one line) and every REALNODE_* and
// NVIDIA_* variable of its environment to stdout, so that a test reads in
// the container's log what the kubelet gave it (a device plugin's Allocate
// answers with environment variables).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Println(strings.Join(os.Args[1:], " "))
	}
	for _, e := range os.Environ() {
		if strings.HasPrefix(e, "REALNODE_") || strings.HasPrefix(e, "NVIDIA_") {
			fmt.Println(e)
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

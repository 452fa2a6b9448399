// Command trainyard-kube is one binary for a whole Kubernetes control plane, like the
// old hyperkube: etcd (embedded), kube-apiserver, kube-controller-manager,
// kube-scheduler and kubectl, each run as its own process by naming it first
// (`trainyard-kube kube-apiserver --flags...`). Trainyard's tests and `make kube-up`
// run a real API server with it (and KWOK for the nodes): see DESIGN §7 and
// libs/stack/src/trainyard_stack/kube.py.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: trainyard-kube etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl [flags]")
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	// Each component parses os.Args itself (cobra): it must see its own flags only.
	os.Args = append([]string{name}, args...)
	switch name {
	case "etcd":
		os.Exit(runEtcd(args))
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubectl":
		if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "trainyard-kube: unknown component %q\n", name)
		os.Exit(2)
	}
}

// runEtcd runs a single-member etcd on loopback until SIGTERM or SIGINT.
func runEtcd(args []string) int {
	flags := pflag.NewFlagSet("etcd", pflag.ContinueOnError)
	dataDir := flags.String("data-dir", "etcd", "where etcd keeps its data")
	clientURL := flags.String("listen-client-urls", "http://127.0.0.1:2379", "client URL")
	peerURL := flags.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = "trainyard"
	cfg.Dir, _ = filepath.Abs(*dataDir)
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	// Without it every request is logged as "expensive" (the default is the package's).
	cfg.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
	if err := setURLs(cfg, *clientURL, *peerURL); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	server, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
	defer server.Close()
	select {
	case <-server.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
		return 0
	case err := <-server.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
}

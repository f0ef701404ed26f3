package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/klog/v2"
)

// schedulerBinary is kube-scheduler built from this module's k8s.io/kubernetes.
var schedulerBinary string

// buildScheduler builds the real kube-scheduler command (seconds with a warm GOCACHE), or takes
// DNE_E2E_SCHEDULER.
func buildScheduler() error {
	if bin := os.Getenv("DNE_E2E_SCHEDULER"); bin != "" {
		schedulerBinary = bin
		return nil
	}
	dir, err := os.MkdirTemp("", "dne-e2e-bin")
	if err != nil {
		return err
	}
	schedulerBinary = filepath.Join(dir, "kube-scheduler")
	cmd := exec.Command("go", "build", "-o", schedulerBinary, "k8s.io/kubernetes/cmd/kube-scheduler")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build k8s.io/kubernetes/cmd/kube-scheduler: %w", err)
	}
	return nil
}

// TestMain sends the in-process kube-apiserver's and kube-scheduler's klog output to a file
// (DNE_E2E_LOG, default a temp file named at start) instead of the test's output, unless the
// process is the throughput bench's null extender.
func TestMain(m *testing.M) {
	// Re-executed as the throughput bench's null extender (nullextender_test.go).
	if addr := os.Getenv(nullExtenderListenEnv); addr != "" {
		fmt.Fprintln(os.Stderr, runNullExtender(addr, os.Getenv(nullExtenderKubeconfigEnv)))
		os.Exit(1)
	}
	flag.Parse()
	path := os.Getenv("DNE_E2E_LOG")
	if path == "" {
		path = filepath.Join(os.TempDir(), fmt.Sprintf("dne-e2e-control-plane-%d.log", os.Getpid()))
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(f)
	fmt.Fprintf(os.Stderr, "control-plane log: %s\n", path)
	if err := buildScheduler(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	klog.Flush()
	f.Close()
	os.Exit(code)
}

// Command cert-manager-controller runs cert-manager's own controllers (github.com/cert-manager/cert-manager
// at the version stack/certmanager/go.mod pins) out of cluster, for the whole-loop test tier.
//
// Why a main of ours: upstream's main lives in the nested module cmd/controller
// (github.com/cert-manager/cert-manager/controller-binary), which replaces the root module with
// "../../" and is published neither as a tag nor through the Go module proxy, so it cannot be
// required. The root module exports everything the controllers are made of: the controller
// context (pkg/controller.NewContextFactory), the registry every controller package adds itself
// to (pkg/controller.Known), the issuer implementations and the informers. This main wires those
// together: it builds the context from a kubeconfig, starts the named controllers and the
// informer factories, and serves cert-manager's Prometheus metrics if asked. What it leaves out,
// and why, is in ../../README.md: leader election (one replica), the config file, the healthz
// server, and every issuer the chart does not use (ACME, Vault, Venafi: their SDKs would be
// most of the build).
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	certmetrics "github.com/cert-manager/cert-manager/pkg/controller/certificates/metrics"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// The issuer types this binary can sign with (each registers itself with pkg/issuer).
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// supported: the controllers linked into this binary, all enabled by default (upstream enables
// the same ones by default, among others for the issuers left out).
var supported = []string{
	issuers.ControllerName, clusterissuers.ControllerName, certmetrics.ControllerName,
	approver.ControllerName, crca.CRControllerName, crselfsigned.CRControllerName,
	trigger.ControllerName, issuing.ControllerName, keymanager.ControllerName,
	requestmanager.ControllerName, readiness.ControllerName, revisionmanager.ControllerName,
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-controller: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig, master, namespace, clusterResourceNamespace, metricsAddress string
		controllers                                                             []string
		workers                                                                 int
		qps                                                                     float32
		burst                                                                   int
		minBackoff, maxBackoff                                                  time.Duration
		copiedAnnotations                                                       []string
		ownerRef                                                                bool
	)
	logf.InitLogs()
	defer logf.FlushLogs()
	logging := logsapi.NewLoggingConfiguration()
	flags := pflag.NewFlagSet("cert-manager-controller", pflag.ContinueOnError)
	flags.StringVar(&kubeconfig, "kubeconfig", "", "path to a kubeconfig (out of cluster); empty: in-cluster")
	flags.StringVar(&master, "master", "", "API server address, overriding the kubeconfig's")
	flags.StringVar(&namespace, "namespace", "", "watch only this namespace (ClusterIssuers are then disabled); empty: all")
	flags.StringVar(&clusterResourceNamespace, "cluster-resource-namespace", "kube-system",
		"namespace of the Secrets that ClusterIssuers refer to")
	flags.StringSliceVar(&controllers, "controllers", supported, "controllers to run: "+strings.Join(supported, ", "))
	flags.IntVar(&workers, "concurrent-workers", 5, "workers per controller")
	flags.Float32Var(&qps, "kube-api-qps", 20, "client-side QPS when the API server has no priority and fairness")
	flags.IntVar(&burst, "kube-api-burst", 50, "client-side burst when the API server has no priority and fairness")
	flags.DurationVar(&minBackoff, "certificate-request-minimum-backoff-duration", time.Hour, "first backoff after a failed issuance")
	flags.DurationVar(&maxBackoff, "certificate-request-maximum-backoff-duration", 32*time.Hour, "longest backoff after failed issuances")
	flags.StringSliceVar(&copiedAnnotations, "copied-annotation-prefixes",
		[]string{"*", "-kubectl.kubernetes.io/", "-fluxcd.io/", "-argocd.argoproj.io/"},
		"annotation prefixes copied from a Certificate to its CertificateRequests (upstream's default)")
	flags.BoolVar(&ownerRef, "enable-certificate-owner-ref", false, "make each Certificate the owner of its Secret")
	flags.StringVar(&metricsAddress, "metrics-listen-address", "", "host:port of cert-manager's Prometheus metrics; empty: none")
	logf.AddFlags(logging, flags)
	if err := flags.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := logf.ValidateAndApply(logging); err != nil {
		return err
	}
	known := controller.Known()
	for _, name := range controllers {
		if _, ok := known[name]; !ok {
			return fmt.Errorf("--controllers: %q is not linked into this binary (it has %s)", name, strings.Join(supported, ", "))
		}
	}
	if namespace != "" {
		controllers = without(controllers, clusterissuers.ControllerName)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "controller")
	log := logf.FromContext(ctx)

	// ACME values are required by the context even with no ACME issuer linked in: upstream's defaults.
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig: kubeconfig, APIServerHost: master, KubernetesAPIQPS: qps, KubernetesAPIBurst: burst, Namespace: namespace,
		ACMEOptions: controller.ACMEOptions{
			HTTP01SolverResourceRequestCPU: resource.MustParse("10m"), HTTP01SolverResourceRequestMemory: resource.MustParse("64Mi"),
			HTTP01SolverResourceLimitsCPU: resource.MustParse("100m"), HTTP01SolverResourceLimitsMemory: resource.MustParse("64Mi"),
			ACMEHTTP01SolverRunAsNonRoot: true, DNS01CheckAuthoritative: true, DNS01CheckRetryPeriod: 10 * time.Second,
		},
		SchedulerOptions: controller.SchedulerOptions{MaxConcurrentChallenges: 60},
		IssuerOptions: controller.IssuerOptions{
			ClusterResourceNamespace: clusterResourceNamespace, ClusterIssuerAmbientCredentials: true,
		},
		CertificateOptions: controller.CertificateOptions{
			EnableOwnerRef: ownerRef, CopiedAnnotationPrefixes: copiedAnnotations,
			CertificateRequestMinimumBackoffDuration: minBackoff, CertificateRequestMaximumBackoffDuration: maxBackoff,
		},
	})
	if err != nil {
		return err
	}
	base, err := factory.Build()
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	failures := make(chan error, len(controllers)+1)
	if metricsAddress != "" {
		listener, err := (&net.ListenConfig{}).Listen(ctx, "tcp", metricsAddress)
		if err != nil {
			return fmt.Errorf("metrics listener %s: %w", metricsAddress, err)
		}
		base.Metrics.SetupCertificateCollector(base.SharedInformerFactory.Certmanager().V1().Certificates().Lister())
		base.Metrics.SetupIssuerCollector(base.SharedInformerFactory.Certmanager().V1().Issuers().Lister())
		server := base.Metrics.NewServer(listener)
		wg.Go(func() {
			if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
				failures <- fmt.Errorf("metrics server: %w", err)
			}
		})
		wg.Go(func() {
			<-ctx.Done()
			shutdown, done := context.WithTimeout(context.Background(), 5*time.Second)
			defer done()
			_ = server.Shutdown(shutdown) //nolint:contextcheck // the root context is already cancelled here
		})
	}

	sort.Strings(controllers)
	log.Info("starting cert-manager controllers", "controllers", controllers, "clusterResourceNamespace", clusterResourceNamespace)
	for _, name := range controllers {
		loop, err := known[name](factory)
		if err != nil {
			cancel()
			wg.Wait()
			return fmt.Errorf("controller %s: %w", name, err)
		}
		wg.Go(func() {
			if err := loop.Run(workers, ctx); err != nil {
				failures <- fmt.Errorf("controller %s: %w", name, err)
			}
		})
	}
	// Informers are requested by the constructors above; start them only now.
	base.SharedInformerFactory.Start(ctx.Done())
	base.KubeSharedInformerFactory.Start(ctx.Done())
	base.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())

	select {
	case <-ctx.Done():
	case err = <-failures:
		cancel()
	}
	wg.Wait()
	base.HTTP01ResourceMetadataInformersFactory.Shutdown()
	base.KubeSharedInformerFactory.Shutdown()
	base.SharedInformerFactory.Shutdown()
	log.Info("cert-manager controllers stopped")
	return err
}

func without(names []string, drop string) []string {
	kept := names[:0:0]
	for _, name := range names {
		if name != drop {
			kept = append(kept, name)
		}
	}
	return kept
}

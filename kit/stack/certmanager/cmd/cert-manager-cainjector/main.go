// Command cert-manager-cainjector runs cert-manager's CA injector (github.com/cert-manager/cert-manager
// at the version stack/certmanager/go.mod pins) out of cluster, for the whole-loop test tier.
//
// Why a main of ours: upstream's main lives in the nested module cmd/cainjector
// (github.com/cert-manager/cert-manager/cainjector-binary), which replaces the root module with
// "../../" and is not served by the Go module proxy. The injectors themselves are exported by the
// root module (pkg/controller/cainjector.RegisterAllInjectors); this main gives them a
// controller-runtime manager the way upstream's does: cert-manager, apiextensions and
// apiregistration types in the scheme, Secrets read straight from the API server (never cached),
// no leader election (one replica), metrics and health listeners only where asked (off by default).
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	logsapi "k8s.io/component-base/logs/api/v1"
	apireg "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-cainjector: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig, master, namespace, metricsAddress, healthAddress string
		ignoreNamespaces                                             []string
		certificates, mutating, validating, apiServices, crds        bool
	)
	logf.InitLogs()
	defer logf.FlushLogs()
	logging := logsapi.NewLoggingConfiguration()
	flags := pflag.NewFlagSet("cert-manager-cainjector", pflag.ContinueOnError)
	flags.StringVar(&kubeconfig, "kubeconfig", "", "path to a kubeconfig (out of cluster); empty: in-cluster")
	flags.StringVar(&master, "master", "", "API server address, overriding the kubeconfig's")
	flags.StringVar(&namespace, "namespace", "", "inject only into objects of this namespace; empty: all")
	flags.StringSliceVar(&ignoreNamespaces, "ignore-namespaces", nil, "namespaces whose objects are never injected")
	flags.BoolVar(&certificates, "enable-certificates-data-source", true, "read CAs from Certificates (cert-manager.io/inject-ca-from)")
	flags.BoolVar(&mutating, "enable-mutatingwebhookconfigurations-injectable", true, "inject into MutatingWebhookConfigurations")
	flags.BoolVar(&validating, "enable-validatingwebhookconfigurations-injectable", true, "inject into ValidatingWebhookConfigurations")
	flags.BoolVar(&apiServices, "enable-apiservices-injectable", true, "inject into APIServices")
	flags.BoolVar(&crds, "enable-customresourcedefinitions-injectable", true, "inject into CRD conversion webhooks")
	flags.StringVar(&metricsAddress, "metrics-listen-address", "0", "host:port of the metrics; \"0\": none")
	flags.StringVar(&healthAddress, "health-probe-listen-address", "0", "host:port of /healthz and /readyz; \"0\": none")
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
	ctrl.SetLogger(logf.Log.WithName("cainjector"))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "cainjector")
	log := logf.FromContext(ctx)

	loading := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
		&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: master}})
	restConfig, err := loading.ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	restConfig = util.RestConfigWithUserAgent(restConfig, "cainjector")

	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiext.AddToScheme(scheme))
	utilruntime.Must(apireg.AddToScheme(scheme))
	var namespaces map[string]cache.Config
	if namespace != "" {
		namespaces = map[string]cache.Config{namespace: {}}
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme: scheme,
		Cache:  cache.Options{ReaderFailOnMissingInformer: true, DefaultNamespaces: namespaces},
		// Secrets are read from the API server at each reconcile, never listed into a cache (as upstream).
		Client:                 client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		LeaderElection:         false,
		Metrics:                metricsserver.Options{BindAddress: metricsAddress},
		HealthProbeBindAddress: healthAddress,
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if healthAddress != "0" {
		if err := mgr.AddHealthzCheck("ping", func(_ *http.Request) error { return nil }); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("informers", func(r *http.Request) error {
			if !mgr.GetCache().WaitForCacheSync(r.Context()) {
				return fmt.Errorf("informer caches not synced")
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if certificates {
		// As upstream: wait (up to 5 minutes) for the Certificate CRD before watching Certificates.
		direct, err := client.New(restConfig, client.Options{Scheme: scheme})
		if err != nil {
			return err
		}
		err = wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			err := direct.Get(ctx, types.NamespacedName{Name: "certificates.cert-manager.io"}, &apiext.CustomResourceDefinition{})
			if apierrors.IsNotFound(err) {
				log.Info("waiting for the certificates.cert-manager.io CRD")
				return false, nil
			}
			return err == nil, err
		})
		if err != nil {
			return fmt.Errorf("certificates.cert-manager.io CRD: %w", err)
		}
	}
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		Namespace: namespace, IgnoreNamespaces: ignoreNamespaces, EnableCertificatesDataSource: certificates,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   mutating,
			cainjector.ValidatingWebhookConfigurationName: validating,
			cainjector.APIServiceName:                     apiServices,
			cainjector.CustomResourceDefinitionName:       crds,
		},
	}); err != nil {
		return fmt.Errorf("registering the injectors: %w", err)
	}
	log.Info("starting cert-manager cainjector", "namespace", namespace)
	return mgr.Start(ctx)
}

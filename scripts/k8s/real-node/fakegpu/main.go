// fakegpu: a minimal device plugin advertising N fake nvidia.com/gpu devices to the
// kubelet over its gRPC registration API (feasibility experiment).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		log.Printf("allocate %v", c.DevicesIds)
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return out, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func main() {
	n := flag.Int("gpus", 8, "devices")
	resource := flag.String("resource", "nvidia.com/gpu", "resource name")
	flag.Parse()
	p := &plugin{}
	for i := 0; i < *n; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("gpu-%d", i), Health: pluginapi.Healthy})
	}
	sock := filepath.Join(pluginapi.DevicePluginPath, "shaper-fakegpu.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { log.Fatal(srv.Serve(lis)) }()

	conn, err := grpc.NewClient("unix://"+pluginapi.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(sock), ResourceName: *resource,
	})
	if err != nil {
		log.Fatalf("register: %v", err)
	}
	conn.Close()
	log.Printf("registered %d x %s", *n, *resource)
	// The kubelet removes our socket when it restarts: exit then (a supervisor re-runs us).
	for {
		time.Sleep(time.Second)
		if _, err := os.Stat(sock); err != nil {
			log.Fatal("socket gone; kubelet restarted")
		}
	}
}

package org.cobalt.peers;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Date;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.eclipse.leshan.client.LeshanClient;
import org.eclipse.leshan.client.LeshanClientBuilder;
import org.eclipse.leshan.client.californium.endpoint.CaliforniumClientEndpointsProvider;
import org.eclipse.leshan.client.californium.endpoint.coap.CoapClientProtocolProvider;
import org.eclipse.leshan.client.californium.endpoint.coaps.CoapsClientProtocolProvider;
import org.eclipse.leshan.client.object.Security;
import org.eclipse.leshan.client.object.Server;
import org.eclipse.leshan.client.observer.LwM2mClientObserverAdapter;
import org.eclipse.leshan.client.resource.BaseInstanceEnabler;
import org.eclipse.leshan.client.resource.LwM2mObjectEnabler;
import org.eclipse.leshan.client.resource.ObjectsInitializer;
import org.eclipse.leshan.client.servers.LwM2mServer;
import org.eclipse.leshan.core.LwM2mId;
import org.eclipse.leshan.core.ResponseCode;
import org.eclipse.leshan.core.model.ObjectLoader;
import org.eclipse.leshan.core.model.ObjectModel;
import org.eclipse.leshan.core.model.ResourceModel.Type;
import org.eclipse.leshan.core.model.StaticModel;
import org.eclipse.leshan.core.node.LwM2mResource;
import org.eclipse.leshan.core.request.DeregisterRequest;
import org.eclipse.leshan.core.request.RegisterRequest;
import org.eclipse.leshan.core.request.UpdateRequest;
import org.eclipse.leshan.core.request.argument.Arguments;
import org.eclipse.leshan.core.response.ExecuteResponse;
import org.eclipse.leshan.core.response.ReadResponse;
import org.eclipse.leshan.core.response.WriteResponse;

/**
 * Eclipse Leshan's LwM2M client (leshan-client-cf) as a test peer for cobalt-lwm2m.
 *
 * <pre>
 * LeshanPeer SERVER-URI ENDPOINT [--psk IDENTITY HEXKEY] [--lifetime SECONDS]
 * </pre>
 *
 * It registers with the server (Security, Server and a Device object whose current
 * time, /3/0/13, changes every second) and prints one event per line on stdout:
 * REGISTERED id=.., UPDATED, DEREGISTERED, EXECUTED path=.., WRITTEN path=.. value=..,
 * FAILED what=.. code=... Lines on stdin drive it: "update" sends a registration
 * update, "deregister" de-registers and exits.
 */
public class LeshanPeer {

    /** Ticks the device's clock. */
    static final ScheduledExecutorService TIMER = Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "device-clock");
        t.setDaemon(true);
        return t;
    });

    static synchronized void event(String line) {
        System.out.println(line);
        System.out.flush();
    }

    /** Object 3 with fixed identity resources, a writable UTC offset and a clock. */
    public static class TestDevice extends BaseInstanceEnabler {
        private String utcOffset = "+01";
        private String timezone = "Europe/Zurich";

        public TestDevice() {
            TIMER.scheduleAtFixedRate(() -> fireResourceChange(13), 1, 1, TimeUnit.SECONDS);
        }

        @Override
        public ReadResponse read(LwM2mServer server, int resourceId) {
            switch (resourceId) {
            case 0:
                return ReadResponse.success(resourceId, "Cobalt Test Devices");
            case 1:
                return ReadResponse.success(resourceId, "leshan-peer");
            case 2:
                return ReadResponse.success(resourceId, "LP-0001");
            case 3:
                return ReadResponse.success(resourceId, "1.0.0");
            case 9:
                return ReadResponse.success(resourceId, 87L);
            case 11:
                Map<Integer, Long> errors = new HashMap<>();
                errors.put(0, 0L);
                return ReadResponse.success(resourceId, errors, Type.INTEGER);
            case 13:
                return ReadResponse.success(resourceId, new Date());
            case 14:
                return ReadResponse.success(resourceId, utcOffset);
            case 15:
                return ReadResponse.success(resourceId, timezone);
            case 16:
                return ReadResponse.success(resourceId, "U");
            default:
                return super.read(server, resourceId);
            }
        }

        @Override
        public WriteResponse write(LwM2mServer server, boolean replace, int resourceId, LwM2mResource value) {
            switch (resourceId) {
            case 14:
                utcOffset = (String) value.getValue();
                break;
            case 15:
                timezone = (String) value.getValue();
                break;
            default:
                return super.write(server, replace, resourceId, value);
            }
            event("WRITTEN path=/3/0/" + resourceId + " value=" + value.getValue());
            fireResourceChange(resourceId);
            return WriteResponse.success();
        }

        @Override
        public ExecuteResponse execute(LwM2mServer server, int resourceId, Arguments arguments) {
            if (resourceId == 4) {
                event("EXECUTED path=/3/0/4 args=" + arguments);
                return ExecuteResponse.success();
            }
            return super.execute(server, resourceId, arguments);
        }

        @Override
        public List<Integer> getAvailableResourceIds(ObjectModel model) {
            return Arrays.asList(0, 1, 2, 3, 4, 9, 11, 13, 14, 15, 16);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2 || args[0].equals("help")) {
            System.err.println("LeshanPeer SERVER-URI ENDPOINT [--psk IDENTITY HEXKEY] [--lifetime SECONDS]");
            System.exit(2);
        }
        String uri = args[0];
        String endpoint = args[1];
        String pskIdentity = null;
        byte[] pskKey = null;
        long lifetime = 300;
        for (int i = 2; i < args.length; i++) {
            switch (args[i]) {
            case "--psk":
                pskIdentity = args[++i];
                pskKey = HexFormat.of().parseHex(args[++i]);
                break;
            case "--lifetime":
                lifetime = Long.parseLong(args[++i]);
                break;
            default:
                System.err.println("unknown option " + args[i]);
                System.exit(2);
            }
        }
        ObjectsInitializer objects = new ObjectsInitializer(new StaticModel(ObjectLoader.loadDefault()));
        int shortServerId = 123;
        Security security = pskIdentity == null ? Security.noSec(uri, shortServerId)
                : Security.psk(uri, shortServerId, pskIdentity.getBytes(StandardCharsets.UTF_8), pskKey);
        objects.setInstancesForObject(LwM2mId.SECURITY, security);
        objects.setInstancesForObject(LwM2mId.SERVER, new Server(shortServerId, lifetime));
        objects.setInstancesForObject(LwM2mId.DEVICE, new TestDevice());
        List<LwM2mObjectEnabler> enablers = objects.create(LwM2mId.SECURITY, LwM2mId.SERVER, LwM2mId.DEVICE);

        LeshanClientBuilder builder = new LeshanClientBuilder(endpoint);
        builder.setObjects(enablers);
        // coap and coaps (the default provider has coap only).
        builder.setEndpointsProviders(new CaliforniumClientEndpointsProvider.Builder(
                new CoapClientProtocolProvider(), new CoapsClientProtocolProvider()).build());
        LeshanClient client = builder.build();
        client.addObserver(new LwM2mClientObserverAdapter() {
            @Override
            public void onRegistrationSuccess(LwM2mServer server, RegisterRequest request, String id) {
                event("REGISTERED id=" + id);
            }

            @Override
            public void onRegistrationFailure(LwM2mServer server, RegisterRequest request, ResponseCode code,
                    String message, Exception cause) {
                event("FAILED what=register code=" + code + " message=" + message);
            }

            @Override
            public void onRegistrationTimeout(LwM2mServer server, RegisterRequest request) {
                event("FAILED what=register code=timeout");
            }

            @Override
            public void onUpdateSuccess(LwM2mServer server, UpdateRequest request) {
                event("UPDATED");
            }

            @Override
            public void onUpdateFailure(LwM2mServer server, UpdateRequest request, ResponseCode code,
                    String message, Exception cause) {
                event("FAILED what=update code=" + code + " message=" + message);
            }

            @Override
            public void onDeregistrationSuccess(LwM2mServer server, DeregisterRequest request) {
                event("DEREGISTERED");
            }

            @Override
            public void onDeregistrationFailure(LwM2mServer server, DeregisterRequest request, ResponseCode code,
                    String message, Exception cause) {
                event("FAILED what=deregister code=" + code + " message=" + message);
            }
        });
        client.start();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            switch (line.trim()) {
            case "update":
                client.triggerRegistrationUpdate();
                break;
            case "deregister":
                client.stop(true);
                client.destroy(false);
                event("EXIT");
                System.exit(0);
                break;
            default:
                event("FAILED what=command line=" + line);
            }
        }
        client.destroy(false);
        System.exit(0);
    }
}

package org.cobalt.bench;

import java.net.InetSocketAddress;
import org.eclipse.californium.core.CoapResource;
import org.eclipse.californium.core.CoapServer;
import org.eclipse.californium.core.coap.CoAP.ResponseCode;
import org.eclipse.californium.core.coap.MediaTypeRegistry;
import org.eclipse.californium.core.config.CoapConfig;
import org.eclipse.californium.core.network.CoapEndpoint;
import org.eclipse.californium.core.server.resources.CoapExchange;
import org.eclipse.californium.elements.config.Configuration;
import org.eclipse.californium.elements.config.UdpConfig;

/**
 * Californium server for bench/compare.sh: GET /benchmark answers 2.05 "hello world".
 *
 * <p>Usage: {@code BenchmarkServer [HOST] [PORT]} (default 127.0.0.1 5683). The default
 * configuration is used, without reading or writing a Californium3.properties file.
 */
public final class BenchmarkServer {
    private BenchmarkServer() {}

    /** The one resource: a fixed text payload. */
    static final class HelloWorld extends CoapResource {
        HelloWorld() {
            super("benchmark");
        }

        @Override
        public void handleGET(CoapExchange exchange) {
            exchange.respond(ResponseCode.CONTENT, "hello world", MediaTypeRegistry.TEXT_PLAIN);
        }
    }

    public static void main(String[] args) {
        String host = args.length > 0 ? args[0] : "127.0.0.1";
        int port = args.length > 1 ? Integer.parseInt(args[1]) : 5683;
        CoapConfig.register();
        UdpConfig.register();
        Configuration config = Configuration.createStandardWithoutFile();
        CoapServer server = new CoapServer(config);
        server.addEndpoint(CoapEndpoint.builder()
                .setConfiguration(config)
                .setInetSocketAddress(new InetSocketAddress(host, port))
                .build());
        server.add(new HelloWorld());
        server.start();
        System.err.println("californium benchmark server on coap://" + host + ":" + port + "/benchmark");
    }
}

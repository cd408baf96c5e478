package io.walrelay.consumer;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.Predicate;

/**
 * What a configuration that logs in with kafka-clients' OAuth login
 * ({@code sasl.login.callback.handler.class=}{@value #HANDLER}) needs besides
 * kafka-clients: jose4j and Jackson's databind, which that handler loads
 * when the consumer is created (jose4j) and when it reads the token
 * endpoint's answer (Jackson), but which kafka-clients does not depend on.
 * Without them the consumer fails with a {@code NoClassDefFoundError} deep
 * in its creation; {@link ConsumerLoop} checks first and says what to add.
 */
final class OAuthLogin {
    /** kafka-clients' OAuth (OIDC client credentials) login callback handler. */
    static final String HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler";
    /** A class of each library the handler needs, and the dependency that brings it. */
    static final Map<String, String> NEEDED = Map.of(
            "org.jose4j.keys.resolvers.VerificationKeyResolver",
            "org.bitbucket.b_c:jose4j (0.9.6 is the version Kafka 4.1.1 ships)",
            "com.fasterxml.jackson.databind.ObjectMapper",
            "com.fasterxml.jackson.core:jackson-databind (2.18 or later; Kafka 4.1.1 ships 2.19)");

    private OAuthLogin() {}

    /**
     * @throws IllegalArgumentException {@code kafka} logs in with {@link #HANDLER} and a library it needs is
     *     not on the class path
     */
    static void check(Map<String, Object> kafka) {
        check(kafka, OAuthLogin::present);
    }

    /** {@link #check(Map)} with {@code present} saying whether a class can be loaded. */
    static void check(Map<String, Object> kafka, Predicate<String> present) {
        if (!usesHandler(kafka)) {
            return;
        }
        List<String> missing = new ArrayList<>();
        new TreeMap<>(NEEDED).forEach((className, dependency) -> {
            if (!present.test(className)) {
                missing.add(dependency);
            }
        });
        if (!missing.isEmpty()) {
            throw new IllegalArgumentException("the Kafka configuration logs in with " + HANDLER
                    + " (sasl.login.callback.handler.class), which needs libraries kafka-clients does not bring: "
                    + "add the dependencies " + String.join(" and ", missing));
        }
    }

    static boolean usesHandler(Map<String, Object> kafka) {
        Object handler = kafka.get("sasl.login.callback.handler.class");
        String name = handler instanceof Class<?> c ? c.getName() : String.valueOf(handler).trim();
        return HANDLER.equals(name);
    }

    private static boolean present(String className) {
        try {
            Class.forName(className, false, OAuthLogin.class.getClassLoader());
            return true;
        } catch (ClassNotFoundException | LinkageError e) {
            return false;
        }
    }
}

package io.walrelay.consumer;

/**
 * A secret Kafka property's reference ({@code env:NAME}, {@code file:/path})
 * that cannot be resolved: a variable not set, a file not readable, an empty
 * secret ({@link KafkaSecrets}). The message names the property and where
 * the secret was looked for, never a value.
 */
public final class SecretException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    private final String property;

    SecretException(String property, String problem) {
        super("the Kafka property " + property + ": " + problem);
        this.property = property;
    }

    /** The property whose reference failed. */
    public String property() {
        return property;
    }
}

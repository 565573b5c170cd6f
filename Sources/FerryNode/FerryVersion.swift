/// Ferry's version, as the admin API and `ferry --version` report it.
public enum FerryVersion {
    public static let current = "0.3.0"
}
